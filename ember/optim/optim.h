// ember::optim in one include: optimizers (SGD, Adam, AdamW, Adadelta), learning-rate schedulers, gradient clipping,
// loss scaling (GradScaler) and the fp32-master MixedPrecisionOptimizer.
// Invariant: includes only the optim layer's public headers.
#pragma once

#include "ember/optim/adadelta.h"
#include "ember/optim/adam.h"
#include "ember/optim/clip_grad.h"
#include "ember/optim/grad_scaler.h"
#include "ember/optim/lr_scheduler.h"
#include "ember/optim/mixed_precision.h"
#include "ember/optim/optimizer.h"
#include "ember/optim/sgd.h"
