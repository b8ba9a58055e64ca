// Activation checkpointing, non-reentrant form: a region's forward packs every tensor its ops save into a handle on a
// shared Frame (shape and dtype only); unpacking a handle whose slot is empty re-runs the region and fills all slots.
// Invariant: a Frame holds the region's inputs (as saved tensors, so an enclosing region discards them too), never
// the tensors its ops saved, except between a recomputation and the unpack of each slot.
#include "ember/autograd/checkpoint.h"

#include <any>
#include <memory>
#include <utility>

#include "ember/autograd/autocast.h"
#include "ember/autograd/node.h"
#include "ember/autograd/saved_hooks.h"
#include "ember/core/generator.h"
#include "ember/core/grad_mode.h"

namespace ember::autograd {

namespace {

thread_local CheckpointStats t_stats;
thread_local int t_recomputing = 0;  // > 0 while a region is being re-run on this thread

// Names the region in the error a saved input raises (modified in place since the forward); never in a graph.
class CheckpointInputsNode final : public Node {
 public:
  CheckpointInputsNode() : Node("checkpoint") {}
  std::string name() const override { return "Checkpoint"; }
  TensorList apply(TensorList&&) override {
    EMBER_THROW(ValueError, "the checkpoint input holder is not a graph node");
  }
};

struct SavedRecord {
  Shape sizes;
  DType dtype;
};

// Note [Checkpoint RNG]
// Every random draw the region's first run makes on this thread (from any generator: dropout uses the default one)
// is logged (DrawRecorder, Note [Draw log] in core/generator.h), and the recomputation replays the log (DrawReplay):
// the same Philox states in the same order, so the same masks, and no generator moves — whatever other threads
// drew in between, and a backward pass leaves every generator exactly where it would be without checkpointing.

struct Frame;
struct Handle {
  std::shared_ptr<Frame> frame;
  size_t index = 0;
};

struct Frame {
  RegionFn fn;
  std::vector<SavedTensor> inputs;  // packed by the enclosing hooks, if any (nested regions)
  std::vector<bool> input_requires_grad;
  std::vector<DrawRecord> draws;     // Note [Checkpoint RNG]
  bool first_run = true;             // fn is still running its forward
  std::vector<Tensor> stash;         // saved tensors of the first run, only while it runs (Note [Unpack in forward])
  autocast::State autocast_state;
  std::vector<SavedRecord> records;  // what the first run saved, in op order
  std::vector<Tensor> slots;         // filled by a recomputation, emptied as backward unpacks them

  // Note [Unpack in forward]
  // A region may itself run a backward (autograd::grad inside fn) before its first run ends; the tensors it saved
  // so far are then still at hand in the stash, which is dropped as soon as fn returns.
  Tensor unpack(size_t index) {
    EMBER_CHECK(index < records.size(), IndexError, "checkpoint: saved tensor ", index, " of ", records.size());
    if (first_run) return stash[index];
    if (slots.size() != records.size() || !slots[index].defined()) recompute();
    Tensor t = std::move(slots[index]);
    slots[index] = Tensor();
    return t;
  }

  // Note [Checkpoint determinism]
  // The recomputation must save the same sequence of tensors as the first run: the i-th tensor saved now stands in
  // for the i-th one saved then. Same ops in the same order give the same shapes and dtypes; a region whose control
  // flow or sizes depend on something other than its inputs, the generator and the autocast state (a counter in the
  // closure, a module switched between train and eval, a parameter replaced) would silently hand wrong tensors to
  // the backward formulas, so any difference in count, shape or dtype raises CheckpointError. (Equal shapes with
  // different values are not detected: the caller guarantees determinism, as with torch.utils.checkpoint.)
  void recompute() {
    static const CheckpointInputsNode holder;
    std::vector<Tensor> args;
    args.reserve(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      Tensor t = inputs[i].unpack(holder);  // may recompute an enclosing region first
      if (t.defined()) {
        t = t.detach();
        if (input_requires_grad[i]) t.requires_grad_(true);
      }
      args.push_back(std::move(t));
    }
    std::vector<Tensor> fresh(records.size());
    size_t count = 0;
    {
      AutoGradMode grad_mode(true);
      DrawReplay replay(draws);
      autocast::StateGuard autocast_guard(autocast_state);
      SavedTensorHooksGuard hooks(
          [this, &fresh, &count](const Tensor& t) -> std::any {
            EMBER_CHECK(count < records.size(), CheckpointError,
                        "checkpoint: the recomputation of a checkpointed region saved more tensors for backward than "
                        "its first run (", records.size(), "); the extra one, #", count, " in op order, is ",
                        t.description(), ". ", hint());
            const SavedRecord& r = records[count];
            EMBER_CHECK(t.sizes() == r.sizes && t.dtype() == r.dtype, CheckpointError,
                        "checkpoint: the recomputation of a checkpointed region saved tensor #", count,
                        " (in op order) as ", dtype_name(t.dtype()), shape_str(t.sizes()), ", but the first run saved ",
                        dtype_name(r.dtype), shape_str(r.sizes), ". ", hint());
            fresh[count++] = t;
            return std::any(t);  // the recomputed graph is dropped with fn's outputs, unless fn runs a backward itself
          },
          [](const std::any& packed) -> Tensor { return std::any_cast<const Tensor&>(packed); });
      ++t_recomputing;
      struct Leave {
        ~Leave() { --t_recomputing; }
      } leave;
      try {
        std::vector<Tensor> outputs = fn(args);
      } catch (const CheckpointError&) {
        throw;
      } catch (const std::exception& e) {
        // Typically an in-place write into a tensor the region saved, which the first run could not see (its saved
        // tensors were handles), or a replay that ran out of logged random draws.
        EMBER_THROW(CheckpointError, "checkpoint: re-running a checkpointed region during backward failed: ",
                    e.what(), ". ", hint());
      }
    }
    EMBER_CHECK(count == records.size(), CheckpointError,
                "checkpoint: the recomputation of a checkpointed region saved ", count,
                " tensors for backward, but its first run saved ", records.size(), " (the first missing is #", count,
                ", ", dtype_name(records[count].dtype), shape_str(records[count].sizes), "). ", hint());
    slots = std::move(fresh);
    ++t_stats.recomputations;
  }

  static const char* hint() {
    return "The region must run the same ops when re-run from the same inputs (see Note [Checkpoint determinism]): "
           "look for nondeterministic code in it, or state it reads that changed between the forward and the "
           "backward (a counter or flag in the closure, train/eval mode, replaced parameters)";
  }
};

}  // namespace

std::vector<Tensor> checkpoint(const RegionFn& fn, const std::vector<Tensor>& inputs) {
  EMBER_CHECK(fn != nullptr, ValueError, "checkpoint: the region function is empty");
  if (!GradMode::is_enabled()) return fn(inputs);

  auto frame = std::make_shared<Frame>();
  frame->fn = fn;
  frame->autocast_state = autocast::current_state();
  frame->inputs.reserve(inputs.size());
  frame->input_requires_grad.reserve(inputs.size());
  for (const Tensor& x : inputs) {
    // Saved before the run: an in-place write to an input inside or after the region is caught at backward
    // (Note [Saved tensor versions]); under an enclosing region's hooks the input is discarded and recomputed too.
    frame->inputs.emplace_back(x);
    frame->input_requires_grad.push_back(x.defined() && requires_grad(x));
  }

  std::vector<Tensor> outputs;
  {
    Frame* f = frame.get();
    SavedTensorHooksGuard hooks(
        [f, &frame](const Tensor& t) -> std::any {
          f->records.push_back({t.sizes(), t.dtype()});
          f->stash.push_back(t);
          return Handle{frame, f->records.size() - 1};
        },
        [](const std::any& packed) -> Tensor {
          const Handle& h = std::any_cast<const Handle&>(packed);
          return h.frame->unpack(h.index);
        });
    DrawRecorder record(frame->draws);
    struct EndFirstRun {  // also when fn throws
      Frame* f;
      ~EndFirstRun() {
        f->first_run = false;
        f->stash.clear();
        f->stash.shrink_to_fit();
      }
    } end_first_run{f};
    outputs = fn(inputs);
  }
  // Nothing saved: no node of the region needs a recomputation (nothing required grad, or the ops save nothing).
  if (!frame->records.empty() && t_recomputing == 0) {  // a nested region re-run by a recomputation counts once
    ++t_stats.regions;
    t_stats.saved_discarded += static_cast<int64_t>(frame->records.size());
  }
  return outputs;
}

Tensor checkpoint(const TensorFn& fn, const Tensor& input) {
  EMBER_CHECK(fn != nullptr, ValueError, "checkpoint: the region function is empty");
  std::vector<Tensor> out = checkpoint([fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0])}; },
                                       std::vector<Tensor>{input});
  return out[0];
}

Tensor checkpoint_sequential(const std::vector<TensorFn>& fns, int64_t segments, const Tensor& input) {
  const int64_t n = static_cast<int64_t>(fns.size());
  EMBER_CHECK(segments >= 1 && segments <= n, ValueError, "checkpoint_sequential: segments must be in [1, ", n,
              "] for ", n, " functions; got ", segments);
  // PyTorch's split: segments - 1 runs of n / segments functions, the last run takes the rest and is not
  // checkpointed (its saved tensors are needed first in backward).
  const int64_t size = n / segments;
  Tensor x = input;
  int64_t begin = 0;
  for (int64_t s = 0; s + 1 < segments; ++s, begin += size) {
    // The run is copied into the region: backward re-runs it after `fns` may be gone.
    std::vector<TensorFn> run(fns.begin() + begin, fns.begin() + begin + size);
    x = checkpoint([run = std::move(run)](const Tensor& in) { return apply_chain(run, in); }, x);
  }
  for (int64_t i = begin; i < n; ++i) x = fns[static_cast<size_t>(i)](x);
  return x;
}

Tensor apply_chain(const std::vector<TensorFn>& fns, const Tensor& x) {
  Tensor h = x;
  for (const TensorFn& f : fns) h = f(h);
  return h;
}

CheckpointStats checkpoint_stats() { return t_stats; }
bool is_recomputing() { return t_recomputing > 0; }
void reset_checkpoint_stats() { t_stats = CheckpointStats{}; }

}  // namespace ember::autograd
