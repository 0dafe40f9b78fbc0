// Everything in lockstep::nn in one include.
#pragma once

#include "lockstep/nn/activation.h"
#include "lockstep/nn/attention.h"
#include "lockstep/nn/container.h"
#include "lockstep/nn/conv.h"
#include "lockstep/nn/data_parallel.h"
#include "lockstep/nn/ddp/distributed_data_parallel.h"
#include "lockstep/nn/functional.h"
#include "lockstep/nn/gpt.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/loss.h"
#include "lockstep/nn/module.h"
#include "lockstep/nn/normalization.h"
#include "lockstep/nn/pooling.h"
#include "lockstep/nn/state_dict.h"
#include "lockstep/nn/sync_batch_norm.h"
#include "lockstep/nn/values.h"
