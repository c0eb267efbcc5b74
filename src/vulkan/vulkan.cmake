# The Vulkan backend: built when the Vulkan headers, loader and a GLSL compiler (glslc, or glslangValidator) are
# found; its tests skip without a device. The shaders are compiled to SPIR-V at build time and embedded as
# arrays of words (<name>.spv.inc, included by the kernel's .cpp).
option(ATTNKIT_VULKAN "Build the Vulkan backend when Vulkan and glslc (or glslangValidator) are found" ON)
set(ATTNKIT_HAS_VULKAN OFF)
if(ATTNKIT_VULKAN)
  find_package(Vulkan QUIET COMPONENTS glslc)
  find_program(ATTNKIT_GLSLC glslc HINTS ${Vulkan_GLSLC_EXECUTABLE})
  find_program(ATTNKIT_GLSLANG glslangValidator)
  if(Vulkan_FOUND AND (ATTNKIT_GLSLC OR ATTNKIT_GLSLANG))
    set(ATTNKIT_HAS_VULKAN ON)
  endif()
endif()

set(attnkit_vulkan_dir ${CMAKE_CURRENT_SOURCE_DIR}/src/vulkan)
if(ATTNKIT_HAS_VULKAN)
  set(attnkit_spv_dir ${CMAKE_CURRENT_BINARY_DIR}/spirv)
  file(MAKE_DIRECTORY ${attnkit_spv_dir})
  set(attnkit_spv_outputs)
  # name|source|defines: the scalar shaders in two builds (UNROLL_LOOPS for GPUs, loops kept for CPU devices).
  foreach(entry attention_rows|attention_rows| attention_rows_unrolled|attention_rows|-DUNROLL_LOOPS
                split_merge|split_merge| split_merge_unrolled|split_merge|-DUNROLL_LOOPS
                attention_coopmat|attention_coopmat| attention_coopmat_emulated|attention_coopmat|-DEMULATED_MATRICES)
    string(REPLACE "|" ";" parts "${entry}")
    list(GET parts 0 name)
    list(GET parts 1 shader)
    list(LENGTH parts n)
    set(defines)
    if(n GREATER 2)
      list(GET parts 2 defines)
    endif()
    set(src ${attnkit_vulkan_dir}/shaders/${shader}.comp)
    set(out ${attnkit_spv_dir}/${name}.spv.inc)
    if(ATTNKIT_GLSLC)
      set(cmd ${ATTNKIT_GLSLC} --target-env=vulkan1.2 -O -mfmt=num ${defines} -o ${out} ${src})
    else()
      set(cmd ${ATTNKIT_GLSLANG} --target-env vulkan1.2 -Os -x ${defines} -o ${out} ${src})
    endif()
    add_custom_command(OUTPUT ${out} COMMAND ${cmd}
                       DEPENDS ${src} ${attnkit_vulkan_dir}/shaders/common.glsl
                       COMMENT "SPIR-V ${name}" VERBATIM)
    list(APPEND attnkit_spv_outputs ${out})
  endforeach()
  add_custom_target(attnkit_spirv DEPENDS ${attnkit_spv_outputs})
  add_dependencies(attnkit_objects attnkit_spirv)
  target_sources(attnkit_objects PRIVATE
    ${attnkit_vulkan_dir}/context.cpp
    ${attnkit_vulkan_dir}/pipeline_statistics.cpp
    ${attnkit_vulkan_dir}/vulkan_plan.cpp
    ${attnkit_vulkan_dir}/vulkan_backend.cpp
    ${attnkit_vulkan_dir}/device_buffers.cpp
    ${attnkit_vulkan_dir}/rows_kernel.cpp
    ${attnkit_vulkan_dir}/coopmat_kernel.cpp
    ${attnkit_vulkan_dir}/split_merge.cpp)
  target_include_directories(attnkit_objects PRIVATE ${attnkit_spv_dir})
  target_link_libraries(attnkit_objects PRIVATE Vulkan::Vulkan)
  message(STATUS "attnkit: Vulkan backend ON (${Vulkan_VERSION})")
else()
  target_sources(attnkit_objects PRIVATE ${attnkit_vulkan_dir}/vulkan_backend_stub.cpp)
  message(STATUS "attnkit: Vulkan backend OFF")
endif()
set_source_files_properties(${attnkit_vulkan_dir}/context.cpp ${attnkit_vulkan_dir}/vulkan_backend.cpp
                            ${attnkit_vulkan_dir}/device_buffers.cpp ${attnkit_vulkan_dir}/pipeline_statistics.cpp
                            PROPERTIES COMPILE_OPTIONS -Wno-missing-field-initializers)
