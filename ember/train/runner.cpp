// TrainRunner (runner.h): option checks, the allocator prepared before the first tensor, setup (data, model, trainer,
// resume, checkpoint plan, batch search), the step loop, trace files, checkpoints and the report.
// Invariant: the step counter counts optimizer steps from the start of training (a resumed run continues it), the
// schedule is positioned at that counter, and a checkpoint holds the weights, the trainer's state and the schedule's.
#include "ember/train/runner.h"

#include <exception>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "ember/autograd/checkpoint_plan.h"
#include "ember/base/error.h"
#include "ember/core/storage.h"
#include "ember/dist/ddp.h"
#include "ember/memory/address_only.h"
#include "ember/memory/alloc_config.h"
#include "ember/memory/cpu_allocator.h"
#include "ember/memory/cuda_device.h"
#include "ember/memory/memory_report.h"
#include "ember/memory/timeline.h"
#include "ember/memory/trace.h"
#include "ember/nn/layers.h"
#include "ember/nn/safetensors.h"
#include "ember/nn/transformer.h"
#include "ember/train/batch_finder.h"
#include "ember/train/estimate.h"
#include "ember/train/grad_accum.h"
#include "ember/train/oom_step.h"
#include "ember/train/runner_tasks.h"
#include "ember/train/training_checkpoint.h"

namespace ember::train {

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kCheckpointFormat = "ember-train/2";  // the runner's entries beside the manifest
constexpr size_t kTraceCapacity = size_t{1} << 18;  // events kept (oldest dropped beyond)

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string lr_text(double lr) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", lr);
  return buf;
}

// A fraction as a percentage: 0.05 -> "5%".
std::string headroom_text(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g%%", 100.0 * f);
  return buf;
}

// An output file's path, checked before training so a run does not end in an error it could have given at the start.
void check_output_path(const std::string& path, const char* flag) {
  if (path.empty()) return;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  EMBER_CHECK(parent.empty() || std::filesystem::is_directory(parent), ValueError, flag, " ", path, ": directory ",
              parent.string(), " does not exist");
  EMBER_CHECK(!std::filesystem::is_directory(path), ValueError, flag, " ", path,
              " is a directory; give a file name");
}

// The tensors' shapes from a safetensors file's header (8 bytes of little-endian length, then a JSON object), without
// reading the data. The caller has read the file's metadata already, so only a file changed since fails here.
detail::TensorShapes read_tensor_shapes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char len_bytes[8] = {};
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | len_bytes[i];
  const uint64_t file_size = in ? static_cast<uint64_t>(std::filesystem::file_size(path)) : 0;
  EMBER_CHECK(in && len <= file_size - 8, FormatError, "--resume ", path, ": the safetensors header is truncated");
  std::string header(static_cast<size_t>(len), '\0');
  in.read(header.data(), static_cast<std::streamsize>(len));
  EMBER_CHECK(in, FormatError, "--resume ", path, ": the safetensors header is truncated");
  const nlohmann::json j = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  EMBER_CHECK(j.is_object(), FormatError, "--resume ", path, ": the safetensors header is not a JSON object");
  detail::TensorShapes shapes;
  for (const auto& [name, entry] : j.items()) {
    if (name == "__metadata__") continue;
    const auto shape = entry.is_object() ? entry.find("shape") : entry.end();
    EMBER_CHECK(shape != entry.end() && shape->is_array(), FormatError, "--resume ", path, ": tensor ", name,
                " has no shape");
    std::vector<int64_t>& dims = shapes[name];
    for (const auto& d : *shape) {
      EMBER_CHECK(d.is_number_unsigned() && d.get<uint64_t>() <= uint64_t{1} << 62, FormatError, "--resume ", path,
                  ": tensor ", name, " has a malformed shape");
      dims.push_back(d.get<int64_t>());
    }
  }
  return shapes;
}

// The checkpoint plan of a block-chain model (GPT: its transformer blocks; Sequential: its children), profiled on one
// micro-batch under the trainer's autocast and installed — the planning bench_train's setup does (train/step.cpp).
autograd::CheckpointPlan plan_checkpointing(nn::Module& model, const Tensor& micro_inputs, const AmpTrainer& trainer,
                                            const autograd::CheckpointPolicy& policy) {
  auto* gpt = dynamic_cast<nn::GPT*>(&model);
  auto* seq = dynamic_cast<nn::Sequential*>(&model);
  EMBER_CHECK(gpt || seq, ValueError, "--checkpoint ", policy.str(), ": the model has no block chain (none only)");
  AutocastGuard region = trainer.autocast();
  return gpt ? gpt->plan_checkpointing(micro_inputs, policy) : seq->plan_checkpointing(micro_inputs, policy);
}

// Turns off OOM explanations (replays) for the batch search, whose OOMs are expected; back on afterwards.
class QuietOoms {
 public:
  explicit QuietOoms(memory::CachingAllocator* alloc) : alloc_(alloc) {
    if (alloc_) alloc_->set_oom_explanations(false);
  }
  ~QuietOoms() {
    if (alloc_) alloc_->set_oom_explanations(true);
  }
  QuietOoms(const QuietOoms&) = delete;
  QuietOoms& operator=(const QuietOoms&) = delete;

 private:
  memory::CachingAllocator* alloc_;
};

}  // namespace

struct TrainRunner::Impl {
  RunnerOptions o;
  uint64_t seed = 0;
  AmpMode mode = AmpMode::none;
  autograd::CheckpointPolicy policy;
  std::unique_ptr<detail::RunTask> task;
  bool resuming = false;
  nn::SafetensorsMetadata resume_meta;  // the runner's entries of the resume file (beside the manifest)

  memory::Allocator* alloc = nullptr;
  memory::CachingAllocator* caching = nullptr;  // the device allocator as a caching allocator (trace, report)
  bool tracing = false;

  std::shared_ptr<nn::Module> model;
  std::unique_ptr<AmpTrainer> trainer;
  std::unique_ptr<optim::LRScheduler> sched;
  std::unique_ptr<GradAccumulator> accum;
  std::unique_ptr<OomResilientStep> resilient;  // --oom-resilient: replaces accum
  std::shared_ptr<dist::ProcessGroup> group;          // --ddp
  std::unique_ptr<dist::DistributedDataParallel> ddp;  // --ddp, made after the trainer (which may cast the model)
  int rank = 0, world = 1;
  autograd::CheckpointPlan plan;
  int64_t batch = 0, micro = 0, step = 0, start_step = 0, total = 0, per_epoch = 0;
  double lr = 0.0;
  bool set_up = false;
  std::string data_desc, search_report;

  void message(const std::string& text) const {
    if (o.on_message) o.on_message(text);
  }
  void validate();
  void prepare_allocator();
  void load_checkpoint();
  TrainingParts parts() const;
  void search_batch();
  void install_plan(int64_t rows);
  void stop_trace();
  LossResult loss(const Batch& b) const { return task->loss(*model, b); }
};

void TrainRunner::Impl::validate() {
  seed = o.seed.value_or(detail::default_seed(o.model));
  task = detail::make_run_task(o, seed);  // ValueError for an unknown model
  mode = parse_amp_mode(o.amp);
  policy = autograd::CheckpointPolicy::parse(o.checkpoint);
  EMBER_CHECK(policy.kind == autograd::CheckpointPolicy::Kind::none || detail::model_has_block_chain(o.model),
              ValueError, "--checkpoint ", o.checkpoint, ": the ", o.model,
              " model has no block chain to checkpoint (none only)");
  EMBER_CHECK(o.device.is_cpu() || o.device.is_cuda(), ValueError, "--device ", o.device.str(),
              ": training runs on cpu or cuda[:N]");
  if (o.device.is_cuda()) {
    const int n = memory::cuda::device_count();
    EMBER_CHECK(o.device.index >= 0 && o.device.index < n, DeviceError, "--device ", o.device.str(),
                " is not available (", n, " CUDA device(s) visible)");
  }
  EMBER_CHECK(o.batch_size >= 0, ValueError, "--batch-size must be >= 1, got ", o.batch_size);
  EMBER_CHECK(o.grad_accum >= 1, ValueError, "--grad-accum must be >= 1, got ", o.grad_accum);
  EMBER_CHECK(o.auto_batch || o.batch_size == 0 || o.batch_size % o.grad_accum == 0, ValueError, "--grad-accum ",
              o.grad_accum, " does not divide --batch-size ", o.batch_size);
  EMBER_CHECK(o.max_batch >= 1, ValueError, "--max-batch (the largest batch the search tries) must be >= 1, got ",
              o.max_batch);
  EMBER_CHECK(o.batch_headroom >= 0.0 && o.batch_headroom <= 0.5, ValueError,
              "--batch-headroom must be a fraction in [0, 0.5], got ", o.batch_headroom);
  EMBER_CHECK(o.max_memory >= 0, ValueError, "--max-memory must be >= 0 bytes, got ", o.max_memory);
  EMBER_CHECK(o.steps >= 0, ValueError, "--steps must be >= 1, got ", o.steps);
  EMBER_CHECK(o.epochs >= 0, ValueError, "--epochs must be >= 1, got ", o.epochs);
  EMBER_CHECK(o.epochs == 0 || o.steps == 0, ValueError, "--epochs and --steps exclude each other");
  EMBER_CHECK(o.epochs == 0 || detail::model_has_epochs(o.model), ValueError, "--epochs applies to mnist-cnn; ",
              o.model, " counts --steps");
  EMBER_CHECK(std::isfinite(o.lr) && o.lr >= 0.0, ValueError, "--lr must be a positive number, got ", o.lr);
  EMBER_CHECK(o.workers >= 0 && o.workers <= 64, ValueError, "--workers must be in [0, 64], got ", o.workers);
  EMBER_CHECK(o.max_test == -1 || o.max_test >= 1, ValueError, "--max-test must be >= 1 (-1: all), got ", o.max_test);
  EMBER_CHECK(o.trace_steps >= 1, ValueError, "--trace-steps must be >= 1, got ", o.trace_steps);
  EMBER_CHECK(o.log_interval >= 0, ValueError, "--log-interval must be >= 1, got ", o.log_interval);
  EMBER_CHECK(o.eval_interval >= 0 && o.eval_iters >= 1, ValueError,
              "--eval-interval must be >= 0 and --eval-iters >= 1, got ", o.eval_interval, " and ", o.eval_iters);
  const bool gpt_shape = o.n_layer != 0 || o.n_head != 0 || o.n_embd != 0 || o.block_size != 0;
  EMBER_CHECK(!gpt_shape || o.model == "char-gpt", ValueError,
              "--n-layer, --n-head, --n-embd and --block-size apply to char-gpt only");
  EMBER_CHECK(o.n_layer >= 0 && o.n_head >= 0 && o.n_embd >= 0 && o.block_size >= 0, ValueError,
              "--n-layer, --n-head, --n-embd and --block-size must be >= 1");
  if (o.auto_batch && o.device.is_cpu() && o.max_memory == 0)
    EMBER_CHECK(memory::alloc_config_from_env().capacity != memory::kNoLimit, ValueError,
                "--batch-size auto on cpu needs a memory limit: --max-memory SIZE (or capacity:SIZE in "
                "EMBER_ALLOC_CONF)");
  if (!o.data.empty() && !o.synthetic)
    EMBER_CHECK(std::filesystem::exists(o.data), ValueError, "--data ", o.data, " does not exist");
  if (o.ddp) {
    EMBER_CHECK(dist::is_available(), ValueError, "--ddp: ember was built without MPI (install OpenMPI, e.g. "
                "scripts/setup-deps, and reconfigure)");
    EMBER_CHECK(o.device.is_cpu(), ValueError, "--ddp trains on cpu over MPI; ", o.device.str(),
                " (NCCL) is not wired into ember train yet");
    EMBER_CHECK(!o.auto_batch, ValueError, "--ddp takes a fixed --batch-size (the global batch), not auto");
    EMBER_CHECK(!o.oom_resilient, ValueError, "--oom-resilient with --ddp: every rank would have to split its "
                "micro-batches alike, which needs a collective the resilient step does not make");
  }
  check_output_path(o.save_path, "--save");
  check_output_path(o.trace_path, "--trace");
  check_output_path(o.html_path, "--html");
  if (!o.resume_path.empty()) {
    EMBER_CHECK(std::filesystem::is_regular_file(o.resume_path), ValueError, "--resume ", o.resume_path,
                ": no such file");
    const TrainingCheckpointInfo info = read_training_checkpoint_info(o.resume_path);  // FormatError: corrupt
    resume_meta = info.extra;
    auto get = [&](const char* key) {
      auto it = resume_meta.find(key);
      return it == resume_meta.end() ? std::string() : it->second;
    };
    EMBER_CHECK(get("format") == kCheckpointFormat, ValueError, "--resume ", o.resume_path,
                ": not a checkpoint of `ember train` (no format ", kCheckpointFormat, " in its metadata)");
    EMBER_CHECK(get("model") == o.model, ValueError, "--resume ", o.resume_path, " holds a ", get("model"),
                " model, not ", o.model);
    EMBER_CHECK(get("amp") == amp_mode_name(mode), ValueError, "--resume ", o.resume_path, " was trained with --amp ",
                get("amp"), ", not ", amp_mode_name(mode));
    start_step = info.step;
    resuming = true;
  }
}

// Note [Allocator first]
// A memory cap must cover every byte (on the CPU the allocator is rebuilt as a simulated device, which is possible
// only while it holds nothing), and a trace must start with an empty allocator so a replay rebuilds the same pool
// and reaches the recorded peak. So both happen before the data, the model or anything else is made.
void TrainRunner::Impl::prepare_allocator() {
  if (o.device.is_cpu()) {
    if (o.max_memory > 0) {
      memory::AllocatorConfig c = memory::alloc_config_from_env();
      c.capacity = o.max_memory;
      memory::configure_cpu_allocator(c);  // ValueError while CPU tensors are alive
    }
    caching = &memory::cpu_allocator();
  } else {
    caching = dynamic_cast<memory::CachingAllocator*>(&memory::cuda::allocator(o.device.index));
    if (o.max_memory > 0) {
      EMBER_CHECK(caching != nullptr, ValueError, "--max-memory: the ", o.device.str(),
                  " allocator takes no capacity");
      memory::AllocatorConfig c = caching->config();
      c.capacity = std::min(c.capacity, o.max_memory);
      caching->set_config(c);
    }
  }
  alloc = &allocator_for(o.device);
  if (!o.trace_path.empty() || !o.html_path.empty()) {
    EMBER_CHECK(caching != nullptr, ValueError, "--trace/--html: the ", o.device.str(), " allocator keeps no trace");
    caching->enable_trace(kTraceCapacity);
    caching->annotate("setup");
    tracing = true;
  }
}

TrainingParts TrainRunner::Impl::parts() const {
  TrainingParts p;
  p.model = model.get();
  p.trainer = trainer.get();
  p.scheduler = sched.get();
  p.loader = task->train_loader();
  for (auto& g : task->generators()) p.generators.push_back(g);
  p.model_kind = o.model;
  return p;
}

// Note [Exact resume]
// The checkpoint is loaded last in setup, after everything that draws from the default generator (the model's
// initialisation, the checkpoint plan's profile, the batch search), so the steps start from the saved generator
// states, loader position, weights, optimizer, scaler and schedule: with the same options they continue bit-identically
// what the saving run did next (docs/reliability.md says under which conditions).
void TrainRunner::Impl::load_checkpoint() {
  const std::string& path = o.resume_path;
  try {
    load_training_checkpoint(path, parts());
  } catch (const ValueError& e) {
    EMBER_THROW(ValueError, "--resume ", path, " does not match the ", o.model, " run: ", e.what());
  }
  step = start_step;
  message("resumed from " + path + " at step " + std::to_string(step));
}

void TrainRunner::Impl::install_plan(int64_t rows) {
  if (policy.kind == autograd::CheckpointPolicy::Kind::none) return;
  const Tensor x = task->random_batch(rows, o.device)[0];
  plan = plan_checkpointing(*model, x, *trainer, policy);
  if (o.device.is_cuda()) memory::cuda::synchronize(o.device.index);
  alloc->empty_cache();  // the profile's cached blocks go back, so the steps fill the cache as they would without it
}

// Note [Two steps per trial]
// --batch-size auto: the largest micro-batch whose real steps (forward, backward, optimizer step) fit the memory limit,
// by find_batch_size with the training state snapshotted and restored around every trial. A trial runs two steps,
// each on a batch of its own drawn just before it (as the step loop draws one per step), with as many batches held
// beside it as the task's data loader holds ahead (Note [Batches held ahead] in data/dataloader.h): the first creates
// the optimizer state from an emptied cache, the second runs as every later training step does — on the cache the first
// left behind, whose split blocks can make it need more than the first (a batch whose first step fits can run out of
// memory in its second). The trials leave --batch-headroom of the limit unused (Note [Batch headroom] in
// batch_finder.h).
void TrainRunner::Impl::search_batch() {
  TrainingSnapshot snapshot(*model, *trainer);
  AccumulationOptions one;
  one.max_grad_norm = task->max_grad_norm();
  GradAccumulator single(*model, *trainer, one);
  const auto ahead = static_cast<size_t>(task->held_ahead());
  auto trial = [&](int64_t rows) {
    const LossFn fn = [this](const Batch& mb) { return loss(mb); };
    // The step's batch, then those the loader holds ahead of it; each of grad_accum micro-batches, as the step loop
    // draws them (the micro-batch trained on is a view of the first).
    std::deque<Batch> stream;
    const int64_t drawn = rows * std::max<int64_t>(o.grad_accum, 1);
    for (int k = 0; k < 2; ++k) {  // Note [Two steps per trial]
      Batch full;
      {
        memory::PhaseScope phase(memory::Phase::Data);
        while (stream.size() < ahead + 1) stream.push_back(task->random_batch(drawn, o.device));
        full = std::move(stream.front());
        stream.pop_front();
      }
      single.step(drawn == rows ? full : slice_batch(full, 0, rows), fn);
    }
  };
  BatchFinderOptions fo;
  fo.device = o.device;
  fo.budget = o.max_memory;
  fo.max_batch = o.max_batch;
  fo.start_batch = std::min(task->default_batch(), o.max_batch);
  fo.restore = [&] { snapshot.restore(); };
  fo.headroom = o.batch_headroom;
  if (o.model == "mlp" || o.model == "cnn" || o.model == "gpt") {
    // The standard tasks have a meta-device estimator (train/estimate.h); the bytes held besides the model and its
    // optimizer state (the task's fixed batch) are added.
    const MemoryBreakdown held = trainer->memory();
    const int64_t extra = std::max<int64_t>(
        0, alloc->stats().allocated_bytes - held.weights - held.master_weights - held.optimizer_state);
    memory::AllocatorConfig policy_now = caching ? memory::effective_config(*caching) : memory::AllocatorConfig{};
    policy_now.capacity = memory::kNoLimit;
    const MetaTarget target = meta_target_for(o.device);
    fo.estimate = [this, extra, policy_now, target](int64_t rows) -> int64_t {
      EstimateOptions eo;
      eo.target = target;
      eo.model = o.model;
      eo.batch = rows;
      eo.amp = o.amp;
      eo.checkpoint = o.checkpoint;
      eo.seed = seed;
      eo.allocator = policy_now;
      try {
        return estimate_step(eo).peak_reserved_bytes + extra;
      } catch (const Error&) {
        return memory::kNoLimit;  // cannot be predicted: treated as not fitting
      }
    };
  }
  BatchFinderResult r;
  {
    QuietOoms quiet(caching);
    r = find_batch_size(trial, fo);
  }
  search_report = r.to_string();
  message(search_report);
  EMBER_CHECK(r.batch > 0, ValueError, "--batch-size auto: not even a batch of 1 fits in ",
              memory::format_bytes(r.trial_budget),
              r.trial_budget < r.budget ? " (" + memory::format_bytes(r.budget) + " less --batch-headroom " +
                                              headroom_text(o.batch_headroom) + ")"
                                        : std::string());
  micro = r.batch;
  batch = micro * o.grad_accum;
  std::string why = "batch size " + std::to_string(batch) + " (auto): micro-batches of " + std::to_string(micro) +
                    " rows, the largest whose training step fits " + memory::format_bytes(r.trial_budget);
  if (r.trial_budget < r.budget)
    why += " (" + memory::format_bytes(r.budget) + " less " + headroom_text(o.batch_headroom) + " headroom)";
  if (micro < o.max_batch) why += " (" + std::to_string(micro + 1) + " rows ran out of memory)";
  else why += " (the search's upper end)";
  if (o.grad_accum > 1) why += ", " + std::to_string(o.grad_accum) + " per step";
  message(why);
}

void TrainRunner::Impl::stop_trace() {
  if (!tracing) return;
  const std::vector<memory::TraceEvent> events = caching->trace();
  const uint64_t dropped = caching->trace_dropped();
  caching->disable_trace();
  tracing = false;
  std::string written;
  if (!o.trace_path.empty()) {
    memory::TraceFileOptions fo;
    fo.alloc_conf = memory::effective_config(*caching).explicit_str();  // `ember mem replay` replays under this policy
    fo.allocator = caching->name();
    memory::write_trace_file(o.trace_path, events, fo);  // Chrome JSON, or JSON Lines for .jsonl
    written += " " + o.trace_path;
  }
  if (!o.html_path.empty()) {
    std::ofstream out(o.html_path, std::ios::binary | std::ios::trunc);
    EMBER_CHECK(out.good(), ValueError, "--html ", o.html_path, ": cannot open for writing");
    memory::TimelineOptions to;
    to.title = "ember train --model " + o.model + " (" + o.device.str() + "): the first " +
               std::to_string(step - start_step) + " steps";
    memory::write_timeline_html(events, out, to);
    out.close();
    EMBER_CHECK(!out.fail(), ValueError, "--html ", o.html_path, ": write failed");
    written += " " + o.html_path;
  }
  const int64_t traced = step - start_step;
  std::string text = "trace: " + std::to_string(events.size()) + " allocator events (setup and " +
                     std::to_string(traced) + (traced == 1 ? " step" : " steps") + ") written to" + written;
  if (dropped > 0) text += " (the oldest " + std::to_string(dropped) + " events were dropped)";
  message(text);
}

// ---- TrainRunner ----------------------------------------------------------------------------------------------------

TrainRunner::TrainRunner(RunnerOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->o = std::move(options);
  impl_->validate();
}

TrainRunner::~TrainRunner() = default;

void TrainRunner::setup() {
  Impl& s = *impl_;
  if (s.set_up) return;
  if (s.o.ddp) {  // before the allocator: ranks other than 0 trace nothing, write nothing and report nothing
    s.group = dist::init(dist::Backend::Mpi);
    s.rank = s.group->rank();
    s.world = s.group->size();
    if (s.rank != 0) {
      s.o.save_path.clear();
      s.o.trace_path.clear();
      s.o.html_path.clear();
      s.o.on_message = nullptr;
      s.o.on_progress = nullptr;
    }
  }
  const RunnerOptions& o = s.o;
  s.prepare_allocator();  // Note [Allocator first]

  const int64_t default_batch = o.batch_size > 0 ? o.batch_size : s.task->default_batch();
  // Samples the run can draw (a generated data set needs no more); -1: unknown, a whole set.
  const int64_t per_step = std::max<int64_t>(1, o.auto_batch ? std::min<int64_t>(o.max_batch, int64_t{1} << 24) *
                                                                   std::min<int64_t>(o.grad_accum, int64_t{1} << 24)
                                                             : default_batch);
  const int64_t planned =
      o.steps <= 0 ? -1 : (o.steps > std::numeric_limits<int64_t>::max() / per_step ? -1 : o.steps * per_step);
  if (s.resuming) {
    try {
      s.task->adopt_data(s.resume_meta);
    } catch (const ValueError& e) {
      EMBER_THROW(ValueError, "--resume ", o.resume_path, ": ", e.what());
    }
  }
  s.data_desc = s.task->load_data(planned);
  s.message("data: " + s.data_desc);
  if (s.resuming) {
    try {
      s.task->adopt_architecture(s.resume_meta, read_tensor_shapes(o.resume_path));
    } catch (const ValueError& e) {
      EMBER_THROW(ValueError, "--resume ", o.resume_path, ": ", e.what());
    }
  }
  s.model = s.task->build_model();
  s.lr = o.lr > 0 ? o.lr : s.task->default_lr();
  s.trainer = std::make_unique<AmpTrainer>(*s.model, s.task->param_groups(*s.model), s.task->optimizer(s.lr), s.mode);
  s.message("model: " + o.model + ", " + std::to_string(s.model->num_parameters()) + " parameters (" +
            memory::format_bytes(s.model->parameter_bytes()) + ") on " + o.device.str() + ", amp " +
            amp_mode_name(s.mode) + ", AdamW lr " + lr_text(s.lr));

  if (o.auto_batch) {
    s.install_plan(std::max<int64_t>(1, std::min(s.task->default_batch(), o.max_batch)));
    if (s.tracing) s.caching->annotate("batch search");
    s.search_batch();
  } else {
    s.batch = default_batch;
    EMBER_CHECK(s.batch % (s.world * o.grad_accum) == 0, ValueError, "--ddp: the batch of ", s.batch,
                " does not divide into ", s.world, " ranks x ", o.grad_accum, " micro-batches");
    s.micro = s.batch / s.world / o.grad_accum;
  }
  s.install_plan(s.micro);
  if (!s.plan.segments.empty()) s.message(s.plan.to_string());

  s.per_epoch = s.task->start_data(s.batch, s.start_step);
  if (o.steps > 0) s.total = o.steps;
  else if (s.per_epoch > 0) {
    const int64_t epochs = std::max<int64_t>(o.epochs, 1);
    EMBER_CHECK(epochs <= std::numeric_limits<int64_t>::max() / s.per_epoch, ValueError, "--epochs ", epochs,
                " times ", s.per_epoch, " steps per epoch overflows the step count");
    s.total = epochs * s.per_epoch;
  }
  else s.total = s.task->default_steps();

  for (optim::ParamGroup& g : s.trainer->optimizer().param_groups()) g.set_lr(s.lr);  // the schedule's base
  s.sched = s.task->scheduler(s.trainer->optimizer(), s.total);
  if (s.resuming) s.load_checkpoint();  // Note [Exact resume]: last, after every setup draw
  AccumulationOptions ao;
  ao.micro_batches = o.grad_accum;
  ao.max_grad_norm = s.task->max_grad_norm();
  if (o.ddp) {
    // Rank 0's weights everywhere; the non-final micro-batches of a step accumulate locally (no_sync).
    s.ddp = std::make_unique<dist::DistributedDataParallel>(s.model, s.group);
    ao.on_micro_batch = [&s](bool final_micro) { s.ddp->set_require_backward_grad_sync(final_micro); };
    s.message("ddp: " + std::to_string(s.world) + " ranks, " + std::to_string(s.batch / s.world) +
              " rows of each batch per rank, " + std::to_string(s.ddp->num_buckets()) + " gradient bucket(s) (" +
              memory::format_bytes(s.ddp->bucket_bytes()) + ")");
  }
  if (o.oom_resilient) {
    // The step starts as --grad-accum micro-batches (whole batches for 1) and halves its micro-batch on an
    // OutOfMemoryError (train/oom_step.h), keeping the size that worked for the following steps.
    OomStepOptions ro;
    ro.max_grad_norm = ao.max_grad_norm;
    ro.micro_batch_size = o.grad_accum > 1 ? s.micro : 0;
    ro.on_oom = [&s](const OomEvent& e) {
      s.message("step " + std::to_string(s.step + 1) + ": out of memory in the " + e.phase + " of rows [" +
                std::to_string(e.start) + ", " + std::to_string(e.start + e.rows) + ") (" +
                memory::format_bytes(e.requested) + " requested); retrying with micro-batches of " +
                std::to_string(e.next_rows) + " rows");
    };
    s.resilient = std::make_unique<OomResilientStep>(*s.model, *s.trainer, ro);
  } else {
    s.accum = std::make_unique<GradAccumulator>(*s.model, *s.trainer, ao);
  }
  if (o.device.is_cuda()) memory::cuda::synchronize(o.device.index);
  s.set_up = true;
}

RunResult TrainRunner::run() {
  // A run that fails while tracing (an OOM in the traced steps, say) still writes the trace and the page up to the
  // failure — the moment a timeline is most wanted. Errors while writing them are dropped: the run's own error wins.
  struct TraceOnFailure {
    Impl& s;
    ~TraceOnFailure() {
      if (std::uncaught_exceptions() > 0 && s.tracing) {
        try {
          s.stop_trace();
        } catch (...) {
        }
      }
    }
  } trace_on_failure{*impl_};
  setup();
  Impl& s = *impl_;
  const RunnerOptions& o = s.o;
  RunResult r;
  r.model = o.model;
  r.device = o.device.str();
  r.amp = amp_mode_name(s.mode);
  r.checkpoint = s.policy.str();
  r.data = s.data_desc;
  r.start_step = s.start_step;
  r.batch_size = s.batch;
  r.grad_accum = o.grad_accum;
  r.micro_batch = s.micro;
  r.parameters = s.model->num_parameters();
  r.batch_search = s.search_report;
  r.final_loss = std::nan("");

  s.alloc->reset_peak_stats();
  const int64_t remaining = std::max<int64_t>(0, s.total - s.step);
  const int64_t log_every = o.log_interval > 0 ? o.log_interval : std::max<int64_t>(1, (remaining + 19) / 20);
  if (remaining == 0)
    s.message("already at step " + std::to_string(s.step) + " of " + std::to_string(s.total) + ": nothing to train");
  else
    s.message("training " + std::to_string(remaining) + (remaining == 1 ? " step" : " steps") + " (to step " +
              std::to_string(s.total) + "), batch " +
              std::to_string(s.batch) +
              (o.grad_accum > 1 ? " in " + std::to_string(o.grad_accum) + " micro-batches" : std::string()) +
              (s.per_epoch > 0 ? ", " + std::to_string(s.per_epoch) + " steps per epoch" : std::string()));

  double train_seconds = 0.0, interval_seconds = 0.0, interval_loss = 0.0;
  int64_t samples = 0, interval_samples = 0, interval_steps = 0;
  const LossFn loss_fn = [&s](const Batch& b) {
    if (s.ddp) s.ddp->prepare_for_backward();  // what DDP's forward does; the task calls the model itself
    return s.loss(b);
  };
  const int64_t local_rows = s.batch / s.world;
  while (s.step < s.total) {
    if (s.tracing) s.caching->annotate("step " + std::to_string(s.step + 1));
    const auto t0 = Clock::now();
    Batch b = s.task->next_batch();
    if (s.ddp) b = slice_batch(b, s.rank * local_rows, (s.rank + 1) * local_rows);  // this rank's shard
    StepResult sr = s.resilient ? s.resilient->step(b, loss_fn) : s.accum->step(b, loss_fn);
    r.ooms_recovered += sr.ooms;
    if (s.ddp) {
      EMBER_CHECK(!s.ddp->in_iteration(), ValueError, "--ddp: a parameter of ", o.model,
                  " got no gradient, so the reduction did not complete before the optimizer step");
      // The job's loss and rows: the mean of the ranks' losses (equal shards) and every rank's samples.
      Tensor l = full({1}, sr.loss, {DType::f64, Device::cpu()});
      s.group->all_reduce(l, dist::ReduceOp::Avg)->wait();
      sr.loss = l.item_double();
      sr.samples *= s.world;
    }
    if (s.sched) s.sched->step();
    ++s.step;
    const double dt = since(t0);
    train_seconds += dt;
    interval_seconds += dt;
    samples += sr.samples;
    interval_samples += sr.samples;
    interval_loss += sr.loss;
    ++interval_steps;
    r.final_loss = sr.loss;
    if (s.tracing && s.step - s.start_step >= o.trace_steps) s.stop_trace();
    const bool last = s.step == s.total;
    if (o.on_progress && (s.step % log_every == 0 || last)) {
      Progress p;
      p.step = s.step;
      p.total_steps = s.total;
      p.epoch = s.per_epoch > 0 ? (s.step - 1) / s.per_epoch + 1 : 0;
      p.loss = interval_loss / static_cast<double>(interval_steps);
      p.samples_per_s = interval_seconds > 0 ? static_cast<double>(interval_samples) / interval_seconds : 0.0;
      const memory::AllocatorStats st = s.alloc->stats();
      p.allocated_bytes = st.allocated_bytes;
      p.reserved_bytes = st.reserved_bytes;
      p.seconds = train_seconds;
      o.on_progress(p);
      interval_seconds = interval_loss = 0.0;
      interval_samples = interval_steps = 0;
    }
    const bool epoch_done = s.per_epoch > 0 && s.step % s.per_epoch == 0;
    const std::string line = s.task->evaluate(*s.model, *s.trainer, s.step, epoch_done, last, r);
    if (!line.empty()) s.message(line);
  }
  if (remaining == 0) {
    const std::string line = s.task->evaluate(*s.model, *s.trainer, s.step, false, true, r);
    if (!line.empty()) s.message(line);
  }
  s.stop_trace();  // a run shorter than --trace-steps
  if (!o.save_path.empty()) {
    save(o.save_path);
    s.message("saved " + o.save_path + " at step " + std::to_string(s.step));
  }
  if (o.device.is_cuda()) memory::cuda::synchronize(o.device.index);
  const memory::AllocatorStats st = s.alloc->stats();
  r.steps = s.step;
  r.epochs = s.per_epoch > 0 ? (s.step + s.per_epoch - 1) / s.per_epoch : 0;
  r.peak_allocated_bytes = st.peak_allocated_bytes;
  r.peak_reserved_bytes = st.peak_reserved_bytes;
  r.seconds = train_seconds;
  r.samples_per_s = train_seconds > 0 ? static_cast<double>(samples) / train_seconds : 0.0;
  r.steps_skipped = s.trainer->steps_skipped();
  if (s.resilient && s.resilient->micro_batch_size() > 0)  // the size the OOMs left (0: whole batches still)
    r.micro_batch = std::min(r.micro_batch, s.resilient->micro_batch_size());
  r.world_size = s.world;
  r.rank = s.rank;
  return r;
}

nn::Module& TrainRunner::model() {
  EMBER_CHECK(impl_->model != nullptr, ValueError, "TrainRunner::model: call setup() or run() first");
  return *impl_->model;
}

AmpTrainer& TrainRunner::trainer() {
  EMBER_CHECK(impl_->trainer != nullptr, ValueError, "TrainRunner::trainer: call setup() or run() first");
  return *impl_->trainer;
}

int64_t TrainRunner::step() const { return impl_->step; }
int64_t TrainRunner::batch_size() const { return impl_->batch; }
const RunnerOptions& TrainRunner::options() const { return impl_->o; }

void TrainRunner::save(const std::string& path) const {
  const Impl& s = *impl_;
  EMBER_CHECK(s.model != nullptr, ValueError, "TrainRunner::save: nothing to save before setup()");
  nn::SafetensorsMetadata meta = s.task->architecture();
  meta["format"] = kCheckpointFormat;
  meta["model"] = s.o.model;
  meta["step"] = std::to_string(s.step);  // also in the manifest; here for readers of plain safetensors metadata
  meta["amp"] = amp_mode_name(s.mode);
  meta["seed"] = std::to_string(s.seed);
  meta["lr"] = lr_text(s.lr);
  meta["batch_size"] = std::to_string(s.batch);
  meta["grad_accum"] = std::to_string(s.o.grad_accum);
  meta["checkpoint"] = s.policy.str();
  save_training_checkpoint(path, s.parts(), s.step, meta);  // atomic: a crash keeps the previous file
}

std::string TrainRunner::memory_report() const {
  const Impl& s = *impl_;
  EMBER_CHECK(s.alloc != nullptr, ValueError, "TrainRunner::memory_report: call setup() or run() first");
  const memory::AllocatorStats st = s.alloc->stats();
  std::string out = s.alloc->name() + " allocator: allocated " + memory::format_bytes(st.allocated_bytes) +
                    ", reserved " + memory::format_bytes(st.reserved_bytes) + "; peak allocated " +
                    memory::format_bytes(st.peak_allocated_bytes) + ", peak reserved " +
                    memory::format_bytes(st.peak_reserved_bytes) + " (over the training steps); " +
                    std::to_string(st.num_allocs) + " allocations, " + std::to_string(st.num_ooms) + " OOMs";
  if (s.caching) out += "\n" + memory::memory_report(*s.caching);
  if (s.ddp)
    out += "\nddp (rank " + std::to_string(s.rank) + " of " + std::to_string(s.world) + "): " +
           std::to_string(s.ddp->num_buckets()) + " gradient bucket(s) holding " +
           memory::format_bytes(s.ddp->bucket_bytes()) + " (tag ddp.buckets/backward, one copy of the gradients)";
  return out;
}

std::string RunResult::to_json() const {
  nlohmann::ordered_json j;
  auto opt = [](const std::optional<double>& v) { return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(); };
  j["model"] = model;
  j["device"] = device;
  j["amp"] = amp;
  j["checkpoint"] = checkpoint;
  j["steps"] = steps;
  j["start_step"] = start_step;
  j["epochs"] = epochs;
  j["batch_size"] = batch_size;
  j["grad_accum"] = grad_accum;
  j["micro_batch"] = micro_batch;
  j["world_size"] = world_size;
  j["parameters"] = parameters;
  j["final_loss"] = std::isfinite(final_loss) ? nlohmann::ordered_json(final_loss) : nlohmann::ordered_json();
  j["test_accuracy"] = opt(test_accuracy);
  j["train_loss"] = opt(train_loss);
  j["val_loss"] = opt(val_loss);
  j["peak_allocated_bytes"] = peak_allocated_bytes;
  j["peak_reserved_bytes"] = peak_reserved_bytes;
  j["samples_per_s"] = samples_per_s;
  j["seconds"] = seconds;
  j["steps_skipped"] = steps_skipped;
  j["ooms_recovered"] = ooms_recovered;
  j["batch_search"] = !batch_search.empty();
  j["data"] = data;
  // The data path and the names may hold bytes that are not UTF-8: replaced by U+FFFD, never a throw.
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace ember::train
