// PruneAmount (prune_amount.h): validation and resolution against a size.
#include "ember/nn/prune_amount.h"

#include <cmath>
#include <sstream>

#include "ember/base/error.h"

namespace ember::nn {

PruneAmount PruneAmount::fraction(double f) {
  EMBER_CHECK(std::isfinite(f) && f >= 0.0 && f <= 1.0, ValueError,
              "prune amount: a fraction must be in [0, 1], got ", f);
  return PruneAmount(true, f, 0);
}

PruneAmount PruneAmount::count(int64_t n) {
  EMBER_CHECK(n >= 0, ValueError, "prune amount: a count must be >= 0, got ", n);
  return PruneAmount(false, 0.0, n);
}

int64_t PruneAmount::resolve(int64_t total) const {
  EMBER_CHECK(total >= 0, ValueError, "prune amount: negative size ", total);
  if (!is_fraction_) {
    EMBER_CHECK(count_ <= total, ValueError, "prune amount: cannot prune ", count_, " of ", total, " elements");
    return count_;
  }
  // std::nearbyint in the default rounding mode rounds half to even, as Python's round() does.
  return static_cast<int64_t>(std::nearbyint(fraction_ * static_cast<double>(total)));
}

std::string PruneAmount::str() const {
  std::ostringstream os;
  if (is_fraction_)
    os << fraction_;
  else
    os << count_ << " elements";
  return os.str();
}

}  // namespace ember::nn
