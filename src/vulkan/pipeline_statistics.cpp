// What the driver says of each compiled pipeline (VK_KHR_pipeline_executable_properties): for reading a kernel's
// registers, shared memory and spills on a GPU where no other tool sees inside a Vulkan pipeline.
#include "context.hpp"

#include <cinttypes>
#include <cstdio>

namespace attnkit::vulkan {
namespace {

std::string statistic_value(const VkPipelineExecutableStatisticKHR& s) {
  char text[64];
  switch (s.format) {
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: return s.value.b32 ? "true" : "false";
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: std::snprintf(text, sizeof text, "%" PRId64, s.value.i64); break;
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: std::snprintf(text, sizeof text, "%" PRIu64, s.value.u64); break;
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR: std::snprintf(text, sizeof text, "%g", s.value.f64); break;
    default: return "?";
  }
  return text;
}

std::string pipeline_label(const std::string& shader, const std::vector<std::int32_t>& constants) {
  std::string s = shader + " [";
  for (std::size_t i = 0; i < constants.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(constants[i]);
  }
  return s + "]";
}

}  // namespace

std::vector<std::string> Context::pipeline_statistics() {
  std::vector<std::string> lines;
  if (!capture_statistics_) return lines;
  auto get_executables = reinterpret_cast<PFN_vkGetPipelineExecutablePropertiesKHR>(
      vkGetDeviceProcAddr(device_, "vkGetPipelineExecutablePropertiesKHR"));
  auto get_statistics = reinterpret_cast<PFN_vkGetPipelineExecutableStatisticsKHR>(
      vkGetDeviceProcAddr(device_, "vkGetPipelineExecutableStatisticsKHR"));
  if (get_executables == nullptr || get_statistics == nullptr) return lines;
  std::lock_guard lock(pipelines_mutex_);
  for (const auto& [key, pipeline] : pipelines_) {
    const std::string label = pipeline_label(std::get<0>(key), std::get<1>(key));
    VkPipelineInfoKHR info{VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR};
    info.pipeline = pipeline.pipeline;
    std::uint32_t count = 0;
    check(get_executables(device_, &info, &count, nullptr), "vkGetPipelineExecutablePropertiesKHR");
    std::vector<VkPipelineExecutablePropertiesKHR> executables(count, {VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR});
    check(get_executables(device_, &info, &count, executables.data()), "vkGetPipelineExecutablePropertiesKHR");
    for (std::uint32_t e = 0; e < count; ++e) {
      VkPipelineExecutableInfoKHR which{VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR};
      which.pipeline = pipeline.pipeline;
      which.executableIndex = e;
      std::uint32_t n = 0;
      check(get_statistics(device_, &which, &n, nullptr), "vkGetPipelineExecutableStatisticsKHR");
      std::vector<VkPipelineExecutableStatisticKHR> stats(n, {VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR});
      check(get_statistics(device_, &which, &n, stats.data()), "vkGetPipelineExecutableStatisticsKHR");
      for (const auto& s : stats) {
        lines.push_back(label + " " + executables[e].name + ": " + s.name + " = " + statistic_value(s));
      }
    }
  }
  return lines;
}

}  // namespace attnkit::vulkan
