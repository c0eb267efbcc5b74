# The libraries every build of attnkit needs: Highway (SIMD) and OpenMP. A missing one stops the configure with
# what it is and how to get it, instead of CMake's "Could not find a package configuration file".
find_package(hwy CONFIG QUIET)
if(NOT hwy_FOUND)
  message(FATAL_ERROR
    "attnkit needs Google Highway (the SIMD library of its CPU kernels), and CMake found none.\n"
    "  Debian/Ubuntu: apt-get install libhwy-dev      Fedora: dnf install highway-devel\n"
    "  conda: conda install -c conda-forge libhwy      Homebrew: brew install highway\n"
    "  Or build it (github.com/google/highway) and pass -DCMAKE_PREFIX_PATH=<its install prefix>\n"
    "  (for pip: pip install . -Ccmake.define.CMAKE_PREFIX_PATH=<prefix>).")
endif()
find_package(OpenMP COMPONENTS CXX)
if(NOT OpenMP_CXX_FOUND)
  message(FATAL_ERROR
    "attnkit needs OpenMP for C++ (its CPU threads), and the compiler ${CMAKE_CXX_COMPILER} has none.\n"
    "  GCC ships it (libgomp); for Clang on Debian/Ubuntu: apt-get install libomp-dev.")
endif()
