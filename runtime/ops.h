// All differentiable ops in one include.
#pragma once

#include "lockstep/runtime/ops/activation.h"
#include "lockstep/runtime/ops/attention.h"
#include "lockstep/runtime/ops/conv.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/linalg.h"
#include "lockstep/runtime/ops/loss.h"
#include "lockstep/runtime/ops/misc.h"
#include "lockstep/runtime/ops/nll_loss.h"
#include "lockstep/runtime/ops/norm.h"
#include "lockstep/runtime/ops/pointwise_loss.h"
#include "lockstep/runtime/ops/pool.h"
#include "lockstep/runtime/ops/reduce.h"
