// The first memory type of a physical device that a resource may live in (`allowed`: its requirements'
// memoryTypeBits) and that has every property in `want`; UINT32_MAX when none has. For the buffers the Vulkan
// tests and benchmarks make themselves.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>

namespace attnkit::test {

inline std::uint32_t memory_type(VkPhysicalDevice physical, std::uint32_t allowed, VkMemoryPropertyFlags want) {
  VkPhysicalDeviceMemoryProperties props;
  vkGetPhysicalDeviceMemoryProperties(physical, &props);
  for (std::uint32_t type = 0; type < props.memoryTypeCount; ++type) {
    if ((allowed >> type & 1u) && (props.memoryTypes[type].propertyFlags & want) == want) return type;
  }
  return UINT32_MAX;
}

}  // namespace attnkit::test
