// The Vulkan backend on a device the caller made (vulkan::Options::adopt): this program makes its own instance
// (with the Khronos validation layers when installed, its own messenger counting their errors), device and queue,
// hands them to the backend before its first use, and checks that host-buffer calls and DeviceAttention calls on
// buffers of its own memory run there and match the CPU backend, that the backend reports the adopted device,
// that bad adoptions are refused by name, and that vulkan::shutdown() leaves the device for this program to
// destroy with no validation error. Its own binary: the backend's context is made once per process. Without a
// usable Vulkan device every test skips.
#include <attnkit/attention.hpp>
#include <attnkit/error.hpp>
#include <attnkit/vulkan.hpp>

#include <vulkan/vulkan.h>

#include <gtest/gtest.h>

#include "mapped_buffer.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace attnkit::test {
namespace {

std::atomic<int> g_validation_errors{0};

VKAPI_ATTR VkBool32 VKAPI_CALL count_errors(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                            VkDebugUtilsMessageTypeFlagsEXT, const VkDebugUtilsMessengerCallbackDataEXT* data,
                                            void*) {
  if (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) {
    ++g_validation_errors;
    std::fprintf(stderr, "validation error: %s\n", data->pMessage);
  }
  return VK_FALSE;
}

bool layer_installed(const char* name) {
  std::uint32_t n = 0;
  vkEnumerateInstanceLayerProperties(&n, nullptr);
  std::vector<VkLayerProperties> layers(n);
  vkEnumerateInstanceLayerProperties(&n, layers.data());
  return std::any_of(layers.begin(), layers.end(), [&](const VkLayerProperties& l) { return std::strcmp(l.layerName, name) == 0; });
}

// The program's own Vulkan objects, as an engine would hold them: made before the tests, destroyed after
// vulkan::shutdown().
struct OwnDevice {
  VkInstance instance = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger = VK_NULL_HANDLE;
  VkPhysicalDevice physical = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;
  std::uint32_t family = 0;
  bool validated = false;

  // Makes them on the first physical device with Vulkan 1.2, 64-bit ints, 16-bit storage and a compute queue;
  // false when there is none (or no loader).
  bool make() {
    validated = layer_installed("VK_LAYER_KHRONOS_validation");
    VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.pApplicationName = "attnkit adopted-device test";
    app.apiVersion = VK_API_VERSION_1_2;
    VkDebugUtilsMessengerCreateInfoEXT mi{VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
    mi.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
    mi.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT;
    mi.pfnUserCallback = count_errors;
    const char* layer = "VK_LAYER_KHRONOS_validation";
    const char* ext = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
    VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    ci.pApplicationInfo = &app;
    if (validated) {
      ci.pNext = &mi;
      ci.enabledLayerCount = 1;
      ci.ppEnabledLayerNames = &layer;
      ci.enabledExtensionCount = 1;
      ci.ppEnabledExtensionNames = &ext;
    }
    if (vkCreateInstance(&ci, nullptr, &instance) != VK_SUCCESS) return false;
    if (validated) {
      auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
          vkGetInstanceProcAddr(instance, "vkCreateDebugUtilsMessengerEXT"));
      if (create == nullptr || create(instance, &mi, nullptr, &messenger) != VK_SUCCESS) return false;
    }
    std::uint32_t n = 0;
    vkEnumeratePhysicalDevices(instance, &n, nullptr);
    std::vector<VkPhysicalDevice> list(n);
    vkEnumeratePhysicalDevices(instance, &n, list.data());
    for (VkPhysicalDevice pd : list) {
      if (suitable(pd)) {
        physical = pd;
        break;
      }
    }
    if (physical == VK_NULL_HANDLE) return false;
    VkPhysicalDeviceVulkan11Features v11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
    v11.storageBuffer16BitAccess = VK_TRUE;
    VkPhysicalDeviceFeatures2 features{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &v11};
    features.features.shaderInt64 = VK_TRUE;
    const float priority = 1.0f;
    VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    qi.queueFamilyIndex = family;
    qi.queueCount = 1;
    qi.pQueuePriorities = &priority;
    VkDeviceCreateInfo di{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, &features};
    di.queueCreateInfoCount = 1;
    di.pQueueCreateInfos = &qi;
    if (vkCreateDevice(physical, &di, nullptr, &device) != VK_SUCCESS) return false;
    vkGetDeviceQueue(device, family, 0, &queue);
    return true;
  }

  bool suitable(VkPhysicalDevice pd) {
    VkPhysicalDeviceProperties props;
    vkGetPhysicalDeviceProperties(pd, &props);
    VkPhysicalDeviceVulkan11Features v11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
    VkPhysicalDeviceFeatures2 f{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &v11};
    vkGetPhysicalDeviceFeatures2(pd, &f);
    if (props.apiVersion < VK_API_VERSION_1_2 || !f.features.shaderInt64 || !v11.storageBuffer16BitAccess) return false;
    std::uint32_t n = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, nullptr);
    std::vector<VkQueueFamilyProperties> families(n);
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, families.data());
    for (std::uint32_t i = 0; i < n; ++i) {
      if (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
        family = i;
        return true;
      }
    }
    return false;
  }

  vulkan::AdoptedDevice handles() const {
    vulkan::AdoptedDevice a;
    a.instance = reinterpret_cast<std::uint64_t>(instance);
    a.physical_device = reinterpret_cast<std::uint64_t>(physical);
    a.device = reinterpret_cast<std::uint64_t>(device);
    a.queue = reinterpret_cast<std::uint64_t>(queue);
    a.queue_family = family;
    return a;
  }

  void destroy() {
    if (device != VK_NULL_HANDLE) vkDestroyDevice(device, nullptr);
    if (messenger != VK_NULL_HANDLE) {
      auto destroy_messenger = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
          vkGetInstanceProcAddr(instance, "vkDestroyDebugUtilsMessengerEXT"));
      destroy_messenger(instance, messenger, nullptr);
    }
    if (instance != VK_NULL_HANDLE) vkDestroyInstance(instance, nullptr);
  }
};

OwnDevice g_own;
bool g_have_device = false;

#define SKIP_WITHOUT_DEVICE() \
  if (!g_have_device) GTEST_SKIP() << "no usable Vulkan device"

TEST(VulkanAdoptedDevice, TheBackendRunsOnTheCallersDevice) {
  SKIP_WITHOUT_DEVICE();
  const vulkan::NativeHandles h = vulkan::native_handles();
  EXPECT_EQ(h.device, reinterpret_cast<std::uint64_t>(g_own.device));
  EXPECT_EQ(h.queue, reinterpret_cast<std::uint64_t>(g_own.queue));
  EXPECT_EQ(h.instance, reinterpret_cast<std::uint64_t>(g_own.instance));
  EXPECT_EQ(h.queue_family, g_own.family);
  VkPhysicalDeviceProperties props;
  vkGetPhysicalDeviceProperties(g_own.physical, &props);
  EXPECT_EQ(vulkan::current_device().name, std::string(props.deviceName));
  EXPECT_FALSE(vulkan::current_device().cooperative_matrix) << "not enabled by this program's device";
}

// The same float16 problem (GQA, causal, key lengths) on host buffers through Attention, against the CPU backend.
TEST(VulkanAdoptedDevice, HostBufferCallsMatchTheCpu) {
  SKIP_WITHOUT_DEVICE();
  AttentionProblem p = AttentionProblem::head_first(2, 4, 2, 19, 130, 40, DType::f16);
  p.causal = true;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  const std::int64_t nq = p.batch * p.heads * p.q_len * p.head_dim, nk = p.batch * p.kv_heads * p.k_len * p.head_dim;
  std::vector<std::uint16_t> q(nq), k(nk), v(nk), o_cpu(nq), o_vk(nq, 0x7e00);
  for (std::int64_t i = 0; i < nq; ++i) store_from_float(q.data(), DType::f16, i, normal(rng));
  for (std::int64_t i = 0; i < nk; ++i) store_from_float(k.data(), DType::f16, i, normal(rng));
  for (std::int64_t i = 0; i < nk; ++i) store_from_float(v.data(), DType::f16, i, normal(rng));
  AttentionArgs a;
  a.q = {q.data(), nq};
  a.k = {k.data(), nk};
  a.v = {v.data(), nk};
  a.o = {o_cpu.data(), nq};
  AttentionConfig cpu;
  cpu.backend = Backend::Cpu;
  Attention(p, cpu).run(a);
  AttentionConfig vk;
  vk.backend = Backend::Vulkan;
  a.o = {o_vk.data(), nq};
  Attention op(p, vk);
  EXPECT_EQ(op.describe().rfind("vulkan", 0), 0u) << op.describe();
  op.run(a);
  double worst = 0.0;
  for (std::int64_t i = 0; i < nq; ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(load_as_float(o_vk.data(), DType::f16, i)) -
                                     load_as_float(o_cpu.data(), DType::f16, i)));
  }
  EXPECT_LE(worst, 4e-3) << "largest difference from the CPU backend";
}

// DeviceAttention on buffers of the program's own memory, run by the backend on the adopted queue and recorded
// into the program's own command buffer: the same bits both ways, equal to the host-buffer call.
TEST(VulkanAdoptedDevice, DeviceBufferCallsRunAndRecordOnTheCallersQueue) {
  SKIP_WITHOUT_DEVICE();
  AttentionProblem p = AttentionProblem::head_first(1, 4, 4, 33, 200, 64, DType::f16);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  const std::int64_t n = p.batch * p.heads * p.q_len * p.head_dim, nk = p.batch * p.kv_heads * p.k_len * p.head_dim;
  const std::uint64_t q_at = 0, k_at = 256 * ((n * 2 + 255) / 256), v_at = k_at + 256 * ((nk * 2 + 255) / 256);
  const std::uint64_t o_at = v_at + 256 * ((nk * 2 + 255) / 256), end = o_at + 256 * ((n * 2 + 255) / 256);
  MappedBuffer buf(g_own.device, g_own.physical, end);
  std::vector<std::uint16_t> q(n), k(nk), v(nk), o_host(n);
  for (std::int64_t i = 0; i < n; ++i) store_from_float(q.data(), DType::f16, i, normal(rng));
  for (std::int64_t i = 0; i < nk; ++i) store_from_float(k.data(), DType::f16, i, normal(rng));
  for (std::int64_t i = 0; i < nk; ++i) store_from_float(v.data(), DType::f16, i, normal(rng));
  std::memcpy(buf.bytes() + q_at, q.data(), n * 2);
  std::memcpy(buf.bytes() + k_at, k.data(), nk * 2);
  std::memcpy(buf.bytes() + v_at, v.data(), nk * 2);
  AttentionConfig vk;
  vk.backend = Backend::Vulkan;
  AttentionArgs a;
  a.q = {q.data(), n};
  a.k = {k.data(), nk};
  a.v = {v.data(), nk};
  a.o = {o_host.data(), n};
  Attention(p, vk).run(a);

  vulkan::DeviceAttention op(p);
  vulkan::DeviceArgs d;
  d.q = buf.at(q_at);
  d.k = buf.at(k_at);
  d.v = buf.at(v_at);
  d.o = buf.at(o_at);
  std::memset(buf.bytes() + o_at, 0xff, n * 2);
  op.run(d);
  EXPECT_EQ(std::memcmp(buf.bytes() + o_at, o_host.data(), n * 2), 0) << "run() on the adopted queue";

  std::memset(buf.bytes() + o_at, 0xff, n * 2);
  VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pi.queueFamilyIndex = g_own.family;
  VkCommandPool pool = VK_NULL_HANDLE;
  ASSERT_EQ(vkCreateCommandPool(g_own.device, &pi, nullptr, &pool), VK_SUCCESS);
  VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ai.commandPool = pool;
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = 1;
  VkCommandBuffer cb = VK_NULL_HANDLE;
  ASSERT_EQ(vkAllocateCommandBuffers(g_own.device, &ai, &cb), VK_SUCCESS);
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  ASSERT_EQ(vkBeginCommandBuffer(cb, &bi), VK_SUCCESS);
  op.record(d, reinterpret_cast<std::uint64_t>(cb));
  ASSERT_EQ(vkEndCommandBuffer(cb), VK_SUCCESS);
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cb;
  ASSERT_EQ(vkQueueSubmit(g_own.queue, 1, &si, VK_NULL_HANDLE), VK_SUCCESS);
  ASSERT_EQ(vkQueueWaitIdle(g_own.queue), VK_SUCCESS);
  vkDestroyCommandPool(g_own.device, pool, nullptr);
  EXPECT_EQ(std::memcmp(buf.bytes() + o_at, o_host.data(), n * 2), 0) << "recorded into the program's command buffer";
}

// Bad adoptions are refused by name, by configure() itself, with the options left as they were (main tries each
// before the real adoption and keeps the messages).
std::vector<std::pair<std::string, std::string>> g_refusals;  // (what was wrong, the error's message)

TEST(VulkanAdoptedDevice, BadAdoptionsAreRefusedByName) {
  SKIP_WITHOUT_DEVICE();
  std::vector<std::pair<std::string, std::string>> expected = {
      {"no instance", "vulkan.Options.adopt"},
      {"a physical device of no instance", "vulkan.Options.adopt.physical_device"},
      {"a queue family past the last", "vulkan.Options.adopt.queue_family"},
      {"validation on an adopted device", "vulkan.Options.validation"},
      {"a device index beside the adopted device", "vulkan.Options.device"},
  };
  ASSERT_GE(g_refusals.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(g_refusals[i].first, expected[i].first);
    EXPECT_NE(g_refusals[i].second.find(expected[i].second), std::string::npos)
        << expected[i].first << ": " << g_refusals[i].second;
  }
  if (g_refusals.size() > expected.size()) {  // (a device without float16 cooperative matrices)
    EXPECT_NE(g_refusals.back().second.find("vulkan.Options.adopt.cooperative_matrix"), std::string::npos)
        << g_refusals.back().second;
  }
}

// The message of configure(options), or "" when it took them.
std::string configure_error(const vulkan::Options& options) {
  try {
    vulkan::configure(options);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void try_bad_adoptions() {
  const vulkan::AdoptedDevice good = g_own.handles();
  const auto attempt = [&](const std::string& what, auto change) {
    vulkan::Options o;
    o.adopt = good;
    change(o);
    g_refusals.emplace_back(what, configure_error(o));
  };
  attempt("no instance", [](vulkan::Options& o) { o.adopt.instance = 0; });
  // (compared with the instance's devices, never called)
  attempt("a physical device of no instance", [](vulkan::Options& o) { o.adopt.physical_device = 0x1000; });
  attempt("a queue family past the last", [](vulkan::Options& o) { o.adopt.queue_family = 1000; });
  attempt("validation on an adopted device", [](vulkan::Options& o) { o.validation = true; });
  attempt("a device index beside the adopted device", [](vulkan::Options& o) { o.device = 0; });
  std::uint32_t n = 0;
  vkEnumerateDeviceExtensionProperties(g_own.physical, nullptr, &n, nullptr);
  std::vector<VkExtensionProperties> ext(n);
  vkEnumerateDeviceExtensionProperties(g_own.physical, nullptr, &n, ext.data());
  const bool coop = std::any_of(ext.begin(), ext.end(), [](const VkExtensionProperties& e) {
    return std::strcmp(e.extensionName, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME) == 0;
  });
  if (!coop) attempt("cooperative matrices the device lacks", [](vulkan::Options& o) { o.adopt.cooperative_matrix = true; });
}

}  // namespace
}  // namespace attnkit::test

int main(int argc, char** argv) {
  using namespace attnkit::test;
  ::testing::InitGoogleTest(&argc, argv);
  g_have_device = g_own.make();
  if (g_have_device) {
    try_bad_adoptions();
    attnkit::vulkan::Options own;
    own.adopt = g_own.handles();
    attnkit::vulkan::configure(own);
  }
  const int result = RUN_ALL_TESTS();
  if (g_have_device) {
    // The backend lets go of the device: afterwards it answers no call, and this program destroys the device with
    // no validation error (nothing of the backend's left on it).
    attnkit::vulkan::shutdown();
    const bool gone = [] {
      try {
        attnkit::vulkan::native_handles();
      } catch (const attnkit::Error&) {
        return true;
      }
      return false;
    }();
    g_own.destroy();
    if (!gone) {
      std::fprintf(stderr, "FAILED: the backend still answered after vulkan::shutdown()\n");
      return 1;
    }
    if (g_validation_errors > 0) {
      std::fprintf(stderr, "FAILED: %d validation errors\n", g_validation_errors.load());
      return 1;
    }
    std::printf("vulkan::shutdown(), then the program's own device destroyed: %s\n",
                g_own.validated ? "no validation error" : "(validation layers not installed)");
  }
  return result;
}
