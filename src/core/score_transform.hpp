// What happens to a raw dot product q.k before the softmax: the scale, then the softcap. The additive mask
// is added after this (see visibility.hpp for the keys that are hidden outright).
#pragma once

#include "portable.hpp"

#include <cmath>

namespace attnkit::core {

struct ScoreTransform {
  float scale = 1.0f;
  float softcap = 0.0f;  // 0: off

  ATTNKIT_HD float operator()(float dot) const {
    const float s = dot * scale;
    return softcap > 0.0f ? softcap * std::tanh(s / softcap) : s;
  }
  // The float64 form the reference uses.
  ATTNKIT_HD double apply(double dot) const {
    const double s = dot * static_cast<double>(scale);
    return softcap > 0.0f ? softcap * std::tanh(s / softcap) : s;
  }
};

}  // namespace attnkit::core
