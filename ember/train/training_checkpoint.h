// Training checkpoints: everything a run needs to continue bit-identically — model weights and buffers, optimizer
// and loss-scaler state, LR schedule, generator states, data-loader position and step — in one safetensors file whose
// header carries a JSON manifest, written atomically (base/atomic_file.h). Invariant: a load validates the whole file
// against the live objects before it changes any of them (Note [Checkpoint load order]).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ember/core/generator.h"
#include "ember/data/dataloader.h"
#include "ember/nn/module.h"
#include "ember/nn/safetensors.h"
#include "ember/optim/grad_scaler.h"
#include "ember/optim/lr_scheduler.h"
#include "ember/train/amp.h"

namespace ember::train {

// The live objects a checkpoint saves from and restores into. `model` is required; the optimizer comes either from
// `trainer` (its state_dict: optimizer, fp32 masters and loss scaler) or from `optimizer` plus an optional `scaler`
// — not both. The rest is optional. Generators are saved by name; the default list is the default generator (what
// dropout and rand draw from).
struct TrainingParts {
  nn::Module* model = nullptr;
  AmpTrainer* trainer = nullptr;
  optim::Optimizer* optimizer = nullptr;
  optim::GradScaler* scaler = nullptr;
  optim::LRScheduler* scheduler = nullptr;
  data::DataLoader* loader = nullptr;
  std::vector<std::pair<std::string, Generator*>> generators = {{"default", &default_generator()}};
  // Recorded and checked on load (ValueError on a mismatch). Empty: the model's type_name(), and the optimizer's
  // class name (with the trainer's amp mode in front, e.g. "fp16/AdamW").
  std::string model_kind, optimizer_kind;
  // Load only. A file holding state for a part not given here (optimizer state, a grad scaler's, an lr schedule, a
  // data-loader position, a generator of another name) is refused by default (ValueError), since the resume would
  // silently not be exact; true loads what is given and leaves the rest unread (fine-tuning from a training
  // checkpoint with a new optimizer or schedule).
  bool partial = false;
};

// What a checkpoint's manifest says (read_training_checkpoint_info, and returned by a load).
struct TrainingCheckpointInfo {
  int64_t version = 0;
  int64_t step = 0;
  std::string model_kind, optimizer_kind, scheduler_kind;  // scheduler_kind empty: none saved
  std::optional<data::LoaderState> loader;
  int64_t loader_batches_per_epoch = -1;                 // -1: a stream, or no loader
  std::map<std::string, PhiloxState> generators;
  std::optional<double> loss_scale;                      // the loss scaler's scale, where one is saved
  std::optional<int64_t> growth_tracker;
  std::map<std::string, std::vector<std::string>> tensors;  // tensor names by group: model, optimizer, scheduler
  nn::SafetensorsMetadata extra;                         // the caller's own header entries (save's `extra`)
};

// The safetensors metadata key holding the manifest, and the format it names.
inline constexpr const char* kTrainingManifestKey = "ember.training_checkpoint";
inline constexpr const char* kTrainingCheckpointFormat = "ember-training-checkpoint";
inline constexpr int64_t kTrainingCheckpointVersion = 1;

// Writes the parts' state at `step` to `path` atomically (the previous file stays intact until the rename).
// `extra`: more header entries for the caller (not the manifest's key). ValueError for missing or contradictory
// parts; Error for I/O failures.
void save_training_checkpoint(const std::string& path, const TrainingParts& parts, int64_t step,
                              const nn::SafetensorsMetadata& extra = {});

// Restores the parts in place from `path` and returns its manifest. FormatError for a file that is not a complete,
// well-formed training checkpoint (truncated, corrupt header, malformed or missing manifest, tensors the manifest does
// not list); ValueError for a checkpoint of another model, optimizer, schedule, loader or generator set (a name,
// shape or dtype that differs), and for one holding state of a part not given unless `parts.partial`. On any error
// nothing is changed.
TrainingCheckpointInfo load_training_checkpoint(const std::string& path, const TrainingParts& parts);

// The manifest alone (reads the header only). FormatError as above.
TrainingCheckpointInfo read_training_checkpoint_info(const std::string& path);

}  // namespace ember::train
