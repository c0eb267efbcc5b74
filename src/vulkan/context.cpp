#include "context.hpp"

#include <attnkit/error.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>

namespace attnkit::vulkan {

void check(VkResult result, const char* call) {
  if (result != VK_SUCCESS) throw RuntimeError(std::string("vulkan: ") + call + " failed (VkResult " + std::to_string(result) + ")");
}

namespace {

constexpr const char* kValidationLayer = "VK_LAYER_KHRONOS_validation";

const char* type_name(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
  }
}
int type_rank(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 3;
    default: return 4;
  }
}

bool has_extension(VkPhysicalDevice pd, const char* name) {
  std::uint32_t n = 0;
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, nullptr);
  std::vector<VkExtensionProperties> ext(n);
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, ext.data());
  return std::any_of(ext.begin(), ext.end(), [&](const VkExtensionProperties& e) { return std::strcmp(e.extensionName, name) == 0; });
}

std::optional<std::uint32_t> compute_family(VkPhysicalDevice pd) {
  std::uint32_t n = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, nullptr);
  std::vector<VkQueueFamilyProperties> families(n);
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, families.data());
  for (std::uint32_t i = 0; i < n; ++i) {
    if (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) return i;
  }
  return std::nullopt;
}

// float16 A/B with float32 C/D in 16x16x16 subgroup-scoped matrices (what the cooperative-matrix kernel uses).
bool offers_f16_matrices(VkInstance instance, VkPhysicalDevice pd) {
  if (!has_extension(pd, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME)) return false;
  auto get = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV>(
      vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV"));
  if (get == nullptr) return false;
  std::uint32_t n = 0;
  get(pd, &n, nullptr);
  std::vector<VkCooperativeMatrixPropertiesNV> props(n, {VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV});
  get(pd, &n, props.data());
  return std::any_of(props.begin(), props.end(), [](const VkCooperativeMatrixPropertiesNV& p) {
    return p.MSize == 16 && p.NSize == 16 && p.KSize == 16 && p.AType == VK_COMPONENT_TYPE_FLOAT16_NV &&
           p.BType == VK_COMPONENT_TYPE_FLOAT16_NV && p.CType == VK_COMPONENT_TYPE_FLOAT32_NV &&
           p.DType == VK_COMPONENT_TYPE_FLOAT32_NV && p.scope == VK_SCOPE_SUBGROUP_NV;
  });
}

struct DeviceFeatures {
  VkPhysicalDeviceFeatures2 base{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  VkPhysicalDeviceVulkan11Features v11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  VkPhysicalDeviceVulkan12Features v12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceCooperativeMatrixFeaturesNV coop{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
  void chain(bool with_coop) {
    base.pNext = &v11;
    v11.pNext = &v12;
    v12.pNext = with_coop ? &coop : nullptr;
    coop.pNext = nullptr;
  }
};

DeviceInfo describe_device(VkInstance instance, VkPhysicalDevice pd, int index) {
  VkPhysicalDeviceDriverProperties driver{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
  VkPhysicalDeviceSubgroupProperties subgroup{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES, &driver};
  VkPhysicalDeviceProperties2 props{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, &subgroup};
  vkGetPhysicalDeviceProperties2(pd, &props);
  DeviceInfo info;
  info.index = index;
  info.name = props.properties.deviceName;
  info.type = type_name(props.properties.deviceType);
  info.driver = std::string(driver.driverName) + " " + driver.driverInfo;
  info.api_version = props.properties.apiVersion;
  info.subgroup_size = subgroup.subgroupSize;
  info.shared_memory_bytes = props.properties.limits.maxComputeSharedMemorySize;
  DeviceFeatures f;
  f.chain(false);
  vkGetPhysicalDeviceFeatures2(pd, &f.base);
  info.usable = props.properties.apiVersion >= VK_API_VERSION_1_2 && compute_family(pd).has_value() &&
                f.base.features.shaderInt64 && f.v11.storageBuffer16BitAccess;
  info.cooperative_matrix = info.usable && f.v12.shaderFloat16 && f.v12.vulkanMemoryModel &&
                            offers_f16_matrices(instance, pd);
  return info;
}

VKAPI_ATTR VkBool32 VKAPI_CALL on_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity, VkDebugUtilsMessageTypeFlagsEXT,
                                          const VkDebugUtilsMessengerCallbackDataEXT* data, void* user) {
  if (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) {
    static_cast<Context*>(user)->record_validation_error(data->pMessage != nullptr ? data->pMessage : "?");
  }
  return VK_FALSE;
}

bool layer_present(const char* name) {
  std::uint32_t n = 0;
  vkEnumerateInstanceLayerProperties(&n, nullptr);
  std::vector<VkLayerProperties> layers(n);
  vkEnumerateInstanceLayerProperties(&n, layers.data());
  return std::any_of(layers.begin(), layers.end(), [&](const VkLayerProperties& l) { return std::strcmp(l.layerName, name) == 0; });
}

VkInstance make_instance(bool validation, const VkDebugUtilsMessengerCreateInfoEXT* messenger) {
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "attnkit";
  app.apiVersion = VK_API_VERSION_1_2;
  VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ci.pApplicationInfo = &app;
  const char* layers[] = {kValidationLayer};
  const char* extensions[] = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME};
  if (validation) {
    ci.enabledLayerCount = 1;
    ci.ppEnabledLayerNames = layers;
    ci.enabledExtensionCount = 1;
    ci.ppEnabledExtensionNames = extensions;
    ci.pNext = messenger;  // also reports what instance creation and destruction find
  }
  VkInstance instance = VK_NULL_HANDLE;
  check(vkCreateInstance(&ci, nullptr, &instance), "vkCreateInstance");
  return instance;
}

std::vector<VkPhysicalDevice> physical_devices(VkInstance instance) {
  std::uint32_t n = 0;
  vkEnumeratePhysicalDevices(instance, &n, nullptr);
  std::vector<VkPhysicalDevice> list(n);
  vkEnumeratePhysicalDevices(instance, &n, list.data());
  return list;
}

// Options::adopt checked as far as the handles allow: the physical device is one of the instance's and offers what
// the kernels need, the queue family has compute. (Which features the caller enabled cannot be read back from a
// VkDevice: AdoptedDevice states what it must have.)
void check_adoption(const Options& options) {
  const AdoptedDevice& a = options.adopt;
  if (options.validation) {
    throw Error("vulkan.Options.validation", "is for a device the backend makes: enable the validation layers on the "
                                             "adopted device's own instance");
  }
  if (options.device >= 0) throw Error("vulkan.Options.device", "must stay -1 with an adopted device");
  if (a.instance == 0 || a.physical_device == 0 || a.queue == 0) {
    throw Error("vulkan.Options.adopt", "instance, physical_device, device and queue must all be set");
  }
  const auto instance = reinterpret_cast<VkInstance>(a.instance);
  const auto physical = reinterpret_cast<VkPhysicalDevice>(a.physical_device);
  const auto list = physical_devices(instance);
  const auto at = std::find(list.begin(), list.end(), physical);
  if (at == list.end()) throw Error("vulkan.Options.adopt.physical_device", "is not a physical device of adopt.instance");
  const DeviceInfo info = describe_device(instance, physical, static_cast<int>(at - list.begin()));
  if (!info.usable) {
    throw Error("vulkan.Options.adopt.physical_device",
                "does not offer what the kernels need (Vulkan 1.2, 16-bit storage, 64-bit integers)");
  }
  std::uint32_t n = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(physical, &n, nullptr);
  std::vector<VkQueueFamilyProperties> families(n);
  vkGetPhysicalDeviceQueueFamilyProperties(physical, &n, families.data());
  if (a.queue_family >= n || !(families[a.queue_family].queueFlags & VK_QUEUE_COMPUTE_BIT)) {
    throw Error("vulkan.Options.adopt.queue_family", "must be a queue family of the physical device with compute");
  }
  if (a.cooperative_matrix && !info.cooperative_matrix) {
    throw Error("vulkan.Options.adopt.cooperative_matrix",
                "the physical device offers no float16 16x16x16 cooperative matrices with float32 accumulators");
  }
}

std::mutex g_context_mutex;
Options g_options;
// Made on first use; destroyed by an exit handler registered once it is made. Not by a static destructor: that
// one is registered at program start, so it runs after the exit handlers the driver registered when the loader
// opened it (exit runs them newest first), and NVIDIA's driver has torn itself down by then (both Vulkan
// binaries crashed at exit on the H200). Registered after the instance and device are made, the handler runs
// before the driver's own.
Context* g_context = nullptr;
bool g_context_failed = false;
std::atomic<bool> g_context_gone{false};

void destroy_shared_context() {
  std::lock_guard lock(g_context_mutex);
  g_context_gone = true;
  delete g_context;
  g_context = nullptr;
}

}  // namespace

Buffer::Buffer(Context& ctx, VkDeviceSize bytes, VkBufferUsageFlags usage, bool host_visible)
    : device_(ctx.device()), bytes_(std::max<VkDeviceSize>(bytes, 16)) {
  VkBufferCreateInfo ci{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  ci.size = bytes_;
  ci.usage = usage;
  ci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  check(vkCreateBuffer(device_, &ci, nullptr, &buffer_), "vkCreateBuffer");
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(device_, buffer_, &req);
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.allocationSize = req.size;
  ai.memoryTypeIndex = host_visible
      ? ctx.memory_type(req.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, 0)
      : ctx.memory_type(req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
  check(vkAllocateMemory(device_, &ai, nullptr, &memory_), "vkAllocateMemory");
  check(vkBindBufferMemory(device_, buffer_, memory_, 0), "vkBindBufferMemory");
  if (host_visible) {
    void* p = nullptr;
    check(vkMapMemory(device_, memory_, 0, VK_WHOLE_SIZE, 0, &p), "vkMapMemory");
    mapped_ = static_cast<std::byte*>(p);
  }
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  std::swap(device_, o.device_);
  std::swap(buffer_, o.buffer_);
  std::swap(memory_, o.memory_);
  std::swap(bytes_, o.bytes_);
  std::swap(mapped_, o.mapped_);
  return *this;
}

bool context_gone() { return g_context_gone; }

Buffer::~Buffer() {
  if (device_ == VK_NULL_HANDLE || context_gone()) return;  // (gone: destroyed with its device)
  if (buffer_ != VK_NULL_HANDLE) vkDestroyBuffer(device_, buffer_, nullptr);
  if (memory_ != VK_NULL_HANDLE) vkFreeMemory(device_, memory_, nullptr);
}

Context::Context(const Options& options) {
  if (options.adopt.device != 0) {
    adopt(options);
  } else {
    make_device(options);
  }
  VkPhysicalDeviceProperties props;
  vkGetPhysicalDeviceProperties(physical_, &props);
  limits_ = props.limits;
  vkGetPhysicalDeviceMemoryProperties(physical_, &memory_);
  {
    std::uint32_t n = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(physical_, &n, nullptr);
    std::vector<VkQueueFamilyProperties> families(n);
    vkGetPhysicalDeviceQueueFamilyProperties(physical_, &n, families.data());
    if (families[queue_family_].timestampValidBits > 0 && limits_.timestampComputeAndGraphics) {
      timestamp_period_ns_ = limits_.timestampPeriod;
    }
  }
  make_layouts();
}

// The caller's device (Options::adopt, checked by configure()).
void Context::adopt(const Options& options) {
  const AdoptedDevice& a = options.adopt;
  owns_device_ = false;
  instance_ = reinterpret_cast<VkInstance>(a.instance);
  physical_ = reinterpret_cast<VkPhysicalDevice>(a.physical_device);
  device_ = reinterpret_cast<VkDevice>(a.device);
  queue_ = reinterpret_cast<VkQueue>(a.queue);
  queue_family_ = a.queue_family;
  const auto list = physical_devices(instance_);
  info_ = describe_device(instance_, physical_, static_cast<int>(std::find(list.begin(), list.end(), physical_) - list.begin()));
  info_.cooperative_matrix = a.cooperative_matrix;
}

// The backend's own instance (with the validation layers when asked) and device, on the chosen physical device.
void Context::make_device(const Options& options) {
  const bool validation = options.validation && layer_present(kValidationLayer);
  if (options.validation && !validation) {
    throw Error("vulkan.Options.validation", "the Khronos validation layer (vulkan-validationlayers) is not installed");
  }
  VkDebugUtilsMessengerCreateInfoEXT mi{VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
  mi.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT;
  mi.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                   VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
  mi.pfnUserCallback = on_message;
  mi.pUserData = this;
  instance_ = make_instance(validation, &mi);
  if (validation) {
    auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkCreateDebugUtilsMessengerEXT"));
    check(create(instance_, &mi, nullptr, &messenger_), "vkCreateDebugUtilsMessengerEXT");
  }

  const auto list = physical_devices(instance_);
  int chosen = -1;
  if (options.device >= 0) {
    if (options.device >= static_cast<int>(list.size()) || !describe_device(instance_, list[options.device], options.device).usable) {
      throw Error("vulkan.Options.device", "no usable Vulkan device has index " + std::to_string(options.device));
    }
    chosen = options.device;
  } else {
    int best_rank = 99;
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      VkPhysicalDeviceProperties p;
      vkGetPhysicalDeviceProperties(list[i], &p);
      if (describe_device(instance_, list[i], i).usable && type_rank(p.deviceType) < best_rank) {
        best_rank = type_rank(p.deviceType);
        chosen = i;
      }
    }
  }
  if (chosen < 0) throw Error("config.backend", "no usable Vulkan device (Vulkan 1.2, 16-bit storage, 64-bit integers)");
  physical_ = list[chosen];
  info_ = describe_device(instance_, physical_, chosen);
  queue_family_ = *compute_family(physical_);

  DeviceFeatures enable;
  enable.chain(info_.cooperative_matrix);
  enable.base.features.shaderInt64 = VK_TRUE;
  enable.v11.storageBuffer16BitAccess = VK_TRUE;
  const char* coop_ext = VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME;
  if (info_.cooperative_matrix) {
    enable.v12.shaderFloat16 = VK_TRUE;
    enable.v12.vulkanMemoryModel = VK_TRUE;
    enable.coop.cooperativeMatrix = VK_TRUE;
  }
  const float priority = 1.0f;
  VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qi.queueFamilyIndex = queue_family_;
  qi.queueCount = 1;
  qi.pQueuePriorities = &priority;
  VkDeviceCreateInfo di{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  di.pNext = &enable.base;
  di.queueCreateInfoCount = 1;
  di.pQueueCreateInfos = &qi;
  std::vector<const char*> extensions;
  if (info_.cooperative_matrix) extensions.push_back(coop_ext);
  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR stats{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR};
  if (options.pipeline_statistics && has_extension(physical_, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME)) {
    VkPhysicalDeviceFeatures2 offered{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &stats};
    vkGetPhysicalDeviceFeatures2(physical_, &offered);
    capture_statistics_ = stats.pipelineExecutableInfo == VK_TRUE;
  }
  if (capture_statistics_) {
    extensions.push_back(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
    stats.pNext = enable.base.pNext;
    enable.base.pNext = &stats;
  }
  di.enabledExtensionCount = static_cast<std::uint32_t>(extensions.size());
  di.ppEnabledExtensionNames = extensions.data();
  check(vkCreateDevice(physical_, &di, nullptr, &device_), "vkCreateDevice");
  vkGetDeviceQueue(device_, queue_family_, 0, &queue_);
}

// What every dispatch uses: the command pool, the descriptor set layout and the pipeline layout.
void Context::make_layouts() {
  VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pi.queueFamilyIndex = queue_family_;
  check(vkCreateCommandPool(device_, &pi, nullptr, &pool_), "vkCreateCommandPool");

  std::vector<VkDescriptorSetLayoutBinding> bindings(kStorageBindings + 1);
  for (std::uint32_t b = 0; b <= kStorageBindings; ++b) {
    bindings[b] = {b, b == 0 ? VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER : VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1,
                   VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  }
  VkDescriptorSetLayoutCreateInfo li{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  li.bindingCount = static_cast<std::uint32_t>(bindings.size());
  li.pBindings = bindings.data();
  check(vkCreateDescriptorSetLayout(device_, &li, nullptr, &set_layout_), "vkCreateDescriptorSetLayout");
  VkPushConstantRange push{VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(std::uint32_t)};
  VkPipelineLayoutCreateInfo pl{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  pl.setLayoutCount = 1;
  pl.pSetLayouts = &set_layout_;
  pl.pushConstantRangeCount = 1;
  pl.pPushConstantRanges = &push;
  check(vkCreatePipelineLayout(device_, &pl, nullptr, &pipeline_layout_), "vkCreatePipelineLayout");
}

Context::~Context() {
  if (device_ != VK_NULL_HANDLE) {
    vkDeviceWaitIdle(device_);
    for (auto& [key, p] : pipelines_) vkDestroyPipeline(device_, p.pipeline, nullptr);
    for (auto& [name, m] : modules_) vkDestroyShaderModule(device_, m, nullptr);
    vkDestroyPipelineLayout(device_, pipeline_layout_, nullptr);
    vkDestroyDescriptorSetLayout(device_, set_layout_, nullptr);
    vkDestroyCommandPool(device_, pool_, nullptr);
    if (owns_device_) vkDestroyDevice(device_, nullptr);
  }
  if (messenger_ != VK_NULL_HANDLE) {
    auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkDestroyDebugUtilsMessengerEXT"));
    destroy(instance_, messenger_, nullptr);
  }
  if (instance_ != VK_NULL_HANDLE && owns_device_) vkDestroyInstance(instance_, nullptr);
}

std::uint32_t Context::memory_type(std::uint32_t allowed, VkMemoryPropertyFlags want, VkMemoryPropertyFlags avoid) const {
  for (std::uint32_t i = 0; i < memory_.memoryTypeCount; ++i) {
    const VkMemoryPropertyFlags f = memory_.memoryTypes[i].propertyFlags;
    if ((allowed & (1u << i)) && (f & want) == want && (f & avoid) == 0) return i;
  }
  throw RuntimeError("vulkan: no memory type with the properties a buffer needs");
}

const Pipeline& Context::pipeline(const std::string& shader, std::span<const std::uint32_t> spirv,
                                  const std::vector<std::int32_t>& constants) {
  std::lock_guard lock(pipelines_mutex_);
  const auto key = std::make_tuple(shader, constants);
  if (auto it = pipelines_.find(key); it != pipelines_.end()) return it->second;
  VkShaderModule& module = modules_[shader];
  if (module == VK_NULL_HANDLE) {
    VkShaderModuleCreateInfo mi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
    mi.codeSize = spirv.size_bytes();
    mi.pCode = spirv.data();
    check(vkCreateShaderModule(device_, &mi, nullptr, &module), "vkCreateShaderModule");
  }
  std::vector<VkSpecializationMapEntry> entries(constants.size());
  for (std::uint32_t i = 0; i < constants.size(); ++i) entries[i] = {i, i * 4u, 4};
  VkSpecializationInfo spec{static_cast<std::uint32_t>(entries.size()), entries.data(), constants.size() * 4,
                            constants.data()};
  VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  ci.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = module;
  ci.stage.pName = "main";
  ci.stage.pSpecializationInfo = &spec;
  ci.layout = pipeline_layout_;
  if (capture_statistics_) ci.flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
  Pipeline p;
  p.layout = pipeline_layout_;
  check(vkCreateComputePipelines(device_, VK_NULL_HANDLE, 1, &ci, nullptr, &p.pipeline), "vkCreateComputePipelines");
  return pipelines_.emplace(key, p).first->second;
}

std::vector<std::string> Context::validation_errors() const {
  std::lock_guard lock(errors_mutex_);
  return errors_;
}
void Context::record_validation_error(std::string message) {
  std::lock_guard lock(errors_mutex_);
  errors_.push_back(std::move(message));
}

Context& shared_context() {
  std::lock_guard lock(g_context_mutex);
  if (!g_context) {
    if (g_context_failed) throw Error("config.backend", "no usable Vulkan device");
    if (g_context_gone) throw Error("config.backend", "the Vulkan backend's context is gone (vulkan::shutdown, or the process is exiting)");
    try {
      g_context = new Context(g_options);
    } catch (...) {
      g_context_failed = true;
      throw;
    }
    std::atexit(destroy_shared_context);
  }
  return *g_context;
}

bool context_available() {
  try {
    shared_context();
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

void shutdown() { destroy_shared_context(); }

void configure(const Options& options) {
  std::lock_guard lock(g_context_mutex);
  if (g_context || g_context_failed) throw Error("vulkan.configure", "must come before the backend's first use");
  if (options.adopt.device != 0) check_adoption(options);
  g_options = options;
}

std::vector<DeviceInfo> devices() {
  std::vector<DeviceInfo> out;
  VkInstance instance = VK_NULL_HANDLE;
  try {
    instance = make_instance(false, nullptr);
  } catch (const std::exception&) {
    return out;
  }
  const auto list = physical_devices(instance);
  for (int i = 0; i < static_cast<int>(list.size()); ++i) out.push_back(describe_device(instance, list[i], i));
  vkDestroyInstance(instance, nullptr);
  return out;
}

bool validation_available() {
  try {
    return layer_present(kValidationLayer);
  } catch (const std::exception&) {
    return false;
  }
}

DeviceInfo current_device() { return shared_context().info(); }

std::vector<std::string> validation_errors() {
  std::lock_guard lock(g_context_mutex);
  return g_context ? g_context->validation_errors() : std::vector<std::string>{};
}

std::vector<std::string> pipeline_statistics() {
  std::lock_guard lock(g_context_mutex);
  return g_context ? g_context->pipeline_statistics() : std::vector<std::string>{};
}

}  // namespace attnkit::vulkan
