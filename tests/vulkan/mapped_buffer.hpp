// A host-visible, coherent storage buffer made on a given Vulkan device, mapped for its whole life: the tensors
// of the device-buffer tests (on the backend's own device, or on a device the test program made and handed over).
#pragma once

#include <attnkit/vulkan.hpp>

#include "memory_type.hpp"

#include <vulkan/vulkan.h>

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>

namespace attnkit::test {

class MappedBuffer {
 public:
  MappedBuffer(VkDevice device, VkPhysicalDevice physical, std::uint64_t bytes) : device_(device), size_(bytes) {
    VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    bi.size = bytes;
    bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;  // (a status word is filled)
    EXPECT_EQ(vkCreateBuffer(device_, &bi, nullptr, &buffer_), VK_SUCCESS);
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(device_, buffer_, &req);
    const std::uint32_t type = memory_type(physical, req.memoryTypeBits,
                                           VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
    EXPECT_NE(type, UINT32_MAX) << "no host-visible, coherent memory";
    VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    ai.allocationSize = req.size;
    ai.memoryTypeIndex = type;
    EXPECT_EQ(vkAllocateMemory(device_, &ai, nullptr, &memory_), VK_SUCCESS);
    EXPECT_EQ(vkBindBufferMemory(device_, buffer_, memory_, 0), VK_SUCCESS);
    EXPECT_EQ(vkMapMemory(device_, memory_, 0, VK_WHOLE_SIZE, 0, &mapped_), VK_SUCCESS);
  }
  ~MappedBuffer() {
    vkUnmapMemory(device_, memory_);
    vkDestroyBuffer(device_, buffer_, nullptr);
    vkFreeMemory(device_, memory_, nullptr);
  }
  MappedBuffer(const MappedBuffer&) = delete;
  MappedBuffer& operator=(const MappedBuffer&) = delete;

  std::byte* bytes() const { return static_cast<std::byte*>(mapped_); }
  // The tensor at byte `offset` of this buffer.
  vulkan::DeviceBuffer at(std::uint64_t offset) const {
    return {reinterpret_cast<std::uint64_t>(buffer_), offset, size_};
  }

 private:
  VkDevice device_;
  std::uint64_t size_;
  VkBuffer buffer_ = VK_NULL_HANDLE;
  VkDeviceMemory memory_ = VK_NULL_HANDLE;
  void* mapped_ = nullptr;
};

}  // namespace attnkit::test
