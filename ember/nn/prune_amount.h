// PruneAmount: how much a pruning call removes — a fraction of the elements (or channels) in [0, 1], or a count
// (PyTorch's float-or-int `amount`). Invariant: a constructed amount is valid on its own (0 <= f <= 1, n >= 0);
// resolve() checks it against the size it is applied to.
#pragma once

#include <cstdint>
#include <string>

namespace ember::nn {

class PruneAmount {
 public:
  static PruneAmount fraction(double f);  // ValueError unless 0 <= f <= 1 (NaN and inf refused)
  static PruneAmount count(int64_t n);    // ValueError when n < 0

  // The number of elements to prune out of `total`: round(f * total) with PyTorch's rounding (half to even), or n
  // (ValueError naming both when n > total).
  int64_t resolve(int64_t total) const;
  bool is_fraction() const { return is_fraction_; }
  double fraction_value() const { return fraction_; }
  int64_t count_value() const { return count_; }
  std::string str() const;  // "0.3" or "12 elements"

 private:
  PruneAmount(bool is_fraction, double f, int64_t n) : is_fraction_(is_fraction), fraction_(f), count_(n) {}
  bool is_fraction_;
  double fraction_;
  int64_t count_;
};

}  // namespace ember::nn
