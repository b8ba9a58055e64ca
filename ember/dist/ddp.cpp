// DistributedDataParallel: the cross-rank shape check, the broadcast from rank 0, gradient buckets and their
// asynchronous all-reduce from post-accumulate-grad hooks, and the end-of-iteration copy back into .grad.
// Invariant: bucket i is launched only after buckets 0..i-1 (Note [DDP buckets]).
#include "ember/dist/ddp.h"

#include <algorithm>
#include <sstream>

#include "ember/autograd/hooks.h"
#include "ember/base/error.h"
#include "ember/core/grad_mode.h"
#include "ember/memory/tags.h"

namespace ember::dist {

// Note [DDP buckets]
// Buckets group the gradients of parameters taken in reverse registration order (the order backward usually
// produces them), cut when the next one would pass bucket_cap_bytes or changes dtype or device; the layout depends
// only on the parameters' shapes and dtypes, which the constructor checks are equal on every rank, so every rank has
// the same buckets. A hook copies its parameter's .grad into its slot; when a bucket's last slot is filled, the bucket
// is ready, and ready buckets are launched (all_reduce, Avg) in bucket order only — a bucket that fills early waits
// for the buckets before it — so the sequence of collectives is identical on every rank even when hooks fire in
// different orders. Communication overlaps the rest of backward: with MPI the launched requests progress inside
// later MPI calls (each hook polls the outstanding ones). Bucket memory comes from the caching allocator, tagged
// "ddp.buckets/backward", and stays allocated for the life of the wrapper (the size of one set of gradients).

namespace {
std::string describe_sig(const std::vector<int64_t>& sig, size_t pos) {
  std::ostringstream os;
  const auto dtype = static_cast<DType>(sig[pos]);
  const int64_t ndim = sig[pos + 1];
  os << dtype_name(dtype) << "[";
  for (int64_t d = 0; d < ndim; ++d) os << (d ? ", " : "") << sig[pos + 2 + d];
  os << "]";
  return os.str();
}
}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 std::shared_ptr<ProcessGroup> group, DdpOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(options) {
  EMBER_CHECK(module_ != nullptr, ValueError, "DistributedDataParallel: null module");
  EMBER_CHECK(group_ != nullptr, ValueError, "DistributedDataParallel: null process group");
  EMBER_CHECK(options_.bucket_cap_bytes > 0, ValueError, "DistributedDataParallel: bucket_cap_bytes must be > 0");
  nn::NamedTensors named;
  for (auto& [name, p] : module_->named_parameters())
    if (p.requires_grad()) named.emplace_back(name, p);
  check_shapes_across_ranks(named);  // collective: every rank raises the same error, before anything moves
  for (auto& [name, p] : named) {
    EMBER_CHECK(p.device().type == group_->device().type, DeviceError, "DistributedDataParallel: parameter '",
                name, "' ", p.description(), " is not on the ", group_->backend(), " group's device ",
                group_->device().str());
    names_.push_back(name);
    params_.push_back(p);
  }
  broadcast_state();
  build_buckets();
  for (size_t i = 0; i < params_.size(); ++i)
    hooks_.push_back(autograd::register_post_accumulate_grad_hook(
        params_[i], [this, i](const Tensor&) { on_gradient(static_cast<int64_t>(i)); }));
}

DistributedDataParallel::~DistributedDataParallel() {
  for (auto& h : hooks_) h.remove();
  // Note [DDP exceptions]: an open iteration is completed so that the other ranks' collectives find their match.
  if (in_iteration()) {
    try {
      finish();
    } catch (...) {
    }
  }
  for (auto& b : buckets_) {
    if (!b.work) continue;
    try {
      b.work->wait();
    } catch (...) {
    }
  }
}

void DistributedDataParallel::check_shapes_across_ranks(const nn::NamedTensors& named) {
  std::vector<int64_t> sig{static_cast<int64_t>(named.size())};
  for (const auto& [name, p] : named) {
    sig.push_back(static_cast<int64_t>(p.dtype()));
    sig.push_back(p.dim());
    for (int64_t s : p.sizes()) sig.push_back(s);
  }
  const Device dev = group_->device();
  const int n = group_->size();
  Tensor len = from_vector(std::vector<int64_t>{static_cast<int64_t>(sig.size())}, {1}).to(dev);
  Tensor lens = empty({n}, {DType::i64, dev});
  group_->all_gather(lens, len)->wait();
  const auto all_lens = lens.to_vector<int64_t>();
  const int64_t max_len = *std::max_element(all_lens.begin(), all_lens.end());
  std::vector<int64_t> padded = sig;
  padded.resize(static_cast<size_t>(max_len), -1);
  Tensor mine = from_vector(padded, {max_len}).to(dev);
  Tensor all = empty({max_len * n}, {DType::i64, dev});
  group_->all_gather(all, mine)->wait();
  const auto flat = all.to_vector<int64_t>();

  // Per rank: the position of each parameter's record in its signature.
  std::vector<std::vector<int64_t>> sigs(n);
  std::vector<std::vector<size_t>> starts(n);
  int64_t max_count = 0;
  for (int r = 0; r < n; ++r) {
    sigs[r].assign(flat.begin() + r * max_len, flat.begin() + r * max_len + all_lens[r]);
    for (size_t pos = 1; pos < sigs[r].size(); pos += 2 + static_cast<size_t>(sigs[r][pos + 1]))
      starts[r].push_back(pos);
    max_count = std::max<int64_t>(max_count, sigs[r][0]);
  }
  auto record = [&](int r, int64_t i) -> std::vector<int64_t> {
    if (i >= static_cast<int64_t>(starts[r].size())) return {};
    const size_t pos = starts[r][i];
    return {sigs[r].begin() + pos, sigs[r].begin() + pos + 2 + sigs[r][pos + 1]};
  };
  for (int64_t i = 0; i < max_count; ++i) {
    const auto ref = record(0, i);
    for (int r = 1; r < n; ++r) {
      const auto other = record(r, i);
      if (other == ref) continue;
      const std::string name = i < static_cast<int64_t>(named.size()) ? named[i].first : "(none here)";
      EMBER_THROW(ValueError, "DistributedDataParallel: parameter ", i, " ('", name, "' on rank ",
                  group_->rank(), ") differs across ranks: rank 0 has ",
                  ref.empty() ? std::string("no such parameter") : describe_sig(ref, 0), ", rank ", r, " has ",
                  other.empty() ? std::string("no such parameter") : describe_sig(other, 0),
                  " (ranks have ", sigs[0][0], " and ", sigs[r][0], " parameters)");
    }
  }
}

void DistributedDataParallel::broadcast_state() {
  if (group_->size() == 1) return;
  std::vector<Tensor> targets = params_;
  if (options_.broadcast_buffers)
    for (auto& [name, b] : module_->named_buffers()) targets.push_back(b);
  NoGradGuard no_grad;
  std::vector<std::pair<Tensor, Tensor>> copies;  // (non-contiguous target, its contiguous stand-in)
  std::vector<WorkPtr> works;
  for (const Tensor& t : targets) {
    if (t.numel() == 0) continue;
    Tensor buf = t.is_contiguous() ? t.detach() : t.contiguous();
    if (!t.is_contiguous()) copies.emplace_back(t, buf);
    works.push_back(group_->broadcast(buf, 0));
  }
  for (auto& w : works) w->wait();
  for (auto& [t, buf] : copies) t.detach().copy_(buf);
  for (const Tensor& t : targets) t.bump_version();
}

void DistributedDataParallel::build_buckets() {
  memory::TagScope tag("ddp.buckets/backward");
  where_.assign(params_.size(), {-1, 0});
  ready_.assign(params_.size(), 0);
  std::vector<std::vector<int64_t>> groups;
  int64_t bytes = 0;
  for (int64_t i = static_cast<int64_t>(params_.size()) - 1; i >= 0; --i) {
    const Tensor& p = params_[i];
    bool cut = groups.empty();
    if (!cut) {
      const Tensor& first = params_[groups.back().front()];
      cut = first.dtype() != p.dtype() || first.device() != p.device() ||
            bytes + p.nbytes() > options_.bucket_cap_bytes;
    }
    if (cut) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(i);
    bytes += p.nbytes();
  }
  for (auto& g : groups) {
    Bucket b;
    int64_t numel = 0;
    for (int64_t i : g) {
      where_[i] = {static_cast<int64_t>(buckets_.size()), numel};
      b.offsets.push_back(numel);
      numel += params_[i].numel();
    }
    b.params = g;
    b.flat = zeros({numel}, {params_[g.front()].dtype(), params_[g.front()].device()});
    buckets_.push_back(std::move(b));
  }
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  prepare_for_backward();
  return module_->forward(x);
}

void DistributedDataParallel::prepare_for_backward() {
  EMBER_CHECK(!in_iteration(), ValueError, "DistributedDataParallel: the previous backward's gradient reduction was "
              "not finished (some parameter got no gradient): call finish() before the optimizer step");
  armed_ = sync_ && GradMode::is_enabled();  // Note [DDP no_sync]
  finished_by_hook_ = false;  // finish() now belongs to this forward's iteration
}

void DistributedDataParallel::start_iteration() {
  iteration_started_ = true;
  finished_by_hook_ = false;
  iteration_done_ = false;
  num_ready_ = 0;
  next_launch_ = 0;
  std::fill(ready_.begin(), ready_.end(), 0);
  for (auto& b : buckets_) {
    b.pending = static_cast<int64_t>(b.params.size());
    b.work.reset();
  }
}

void DistributedDataParallel::on_gradient(int64_t index) {
  if (!armed_) return;  // Note [DDP no_sync]
  if (!in_iteration()) start_iteration();
  EMBER_CHECK(!ready_[index], ValueError, "DistributedDataParallel: parameter '", names_[index],
              "' received a second gradient in one iteration (two backward passes without finish(); use no_sync() "
              "for gradient accumulation)");
  ready_[index] = 1;
  ++num_ready_;
  auto [bi, offset] = where_[index];
  Bucket& b = buckets_[bi];
  {
    NoGradGuard no_grad;
    const Tensor& p = params_[index];
    b.flat.narrow(0, offset, p.numel()).view(p.sizes()).copy_(p.grad());
  }
  --b.pending;
  launch_ready_buckets();
  for (size_t i = 0; i < next_launch_; ++i) buckets_[i].work->is_completed();  // lets MPI progress the requests
  if (num_ready_ == static_cast<int64_t>(params_.size())) {
    complete_iteration();
    finished_by_hook_ = true;
  }
}

void DistributedDataParallel::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    Bucket& b = buckets_[next_launch_];
    b.work = group_->all_reduce(b.flat, ReduceOp::Avg);
    ++next_launch_;
  }
}

void DistributedDataParallel::complete_iteration() {
  launch_ready_buckets();
  NoGradGuard no_grad;
  for (auto& b : buckets_) {
    b.work->wait();
    for (size_t k = 0; k < b.params.size(); ++k) {
      const Tensor& p = params_[b.params[k]];
      Tensor avg = b.flat.narrow(0, b.offsets[k], p.numel()).view(p.sizes());
      Tensor g = p.grad();
      if (g.defined() && g.is_contiguous() && g.sizes() == p.sizes() && g.dtype() == p.dtype())
        g.copy_(avg);
      else
        p.set_grad(avg.clone());
    }
    b.work.reset();
  }
  iteration_done_ = true;
  armed_ = false;  // the next backward reduces only through a new forward()
}

void DistributedDataParallel::finish() {
  // Also when no hook fired at all (no parameter got a gradient on this rank): the other ranks may be reducing.
  if (!in_iteration()) {
    if (finished_by_hook_) {  // the last hook completed this iteration
      finished_by_hook_ = false;
      return;
    }
    if (!armed_) return;  // the forward ran inside no_sync(): nothing is reduced (Note [DDP no_sync])
    start_iteration();
  }
  // Parameters without a gradient in this iteration contribute zeros.
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    ready_[i] = 1;
    auto [bi, offset] = where_[i];
    buckets_[bi].flat.narrow(0, offset, params_[i].numel()).zero_();
    --buckets_[bi].pending;
  }
  num_ready_ = static_cast<int64_t>(params_.size());
  complete_iteration();
}

std::vector<std::vector<int64_t>> DistributedDataParallel::bucket_assignment() const {
  std::vector<std::vector<int64_t>> out;
  for (const auto& b : buckets_) out.push_back(b.params);
  return out;
}

int64_t DistributedDataParallel::bucket_bytes() const {
  int64_t total = 0;
  for (const auto& b : buckets_) total += b.flat.nbytes();
  return total;
}

}  // namespace ember::dist
