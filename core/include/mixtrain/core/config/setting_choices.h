// The choices of the host's own config keys (config/choices.h): each an enum, with the table of
// its names that the schema's one_of (config/host_schemas.h) and the reader share. The learning-
// rate schedules' are in train/lr_schedule.h, beside the schedule.
#pragma once

#include "mixtrain/core/config/choices.h"

namespace mixtrain::core {

// run.on_nonfinite: what a non-finite loss does when no loss scaler absorbs it.
enum class NonfiniteAction { skip, stop };
inline constexpr ChoiceTable<NonfiniteAction, 2> kNonfiniteActions{
    {{"skip", NonfiniteAction::skip}, {"stop", NonfiniteAction::stop}}};

// run.metrics: where metric records go (runs/metrics_log.h opens them).
enum class MetricsSinkKind { jsonl, tensorboard, csv };
inline constexpr ChoiceTable<MetricsSinkKind, 3> kMetricsSinks{
    {{"jsonl", MetricsSinkKind::jsonl},
     {"tensorboard", MetricsSinkKind::tensorboard},
     {"csv", MetricsSinkKind::csv}}};

// eval.weights: the weights evaluation runs with.
enum class EvalWeights { master, ema };
inline constexpr ChoiceTable<EvalWeights, 2> kEvalWeights{
    {{"master", EvalWeights::master}, {"ema", EvalWeights::ema}}};

// distributed.batch_norm: whose batch the batch-norm statistics are taken over.
enum class BatchNormStats { local, sync };
inline constexpr ChoiceTable<BatchNormStats, 2> kBatchNormStats{
    {{"local", BatchNormStats::local}, {"sync", BatchNormStats::sync}}};

// data.source: where the rows come from.
enum class DataSource { synthetic, npy, idx, cifar10, image_folder, tokens, text };
inline constexpr ChoiceTable<DataSource, 7> kDataSources{
    {{"synthetic", DataSource::synthetic},
     {"npy", DataSource::npy},
     {"idx", DataSource::idx},
     {"cifar10", DataSource::cifar10},
     {"image_folder", DataSource::image_folder},
     {"tokens", DataSource::tokens},
     {"text", DataSource::text}}};
inline bool is_token_source(DataSource s) {
  return s == DataSource::tokens || s == DataSource::text;
}

// model.preset: a whole architecture from a few sizes, or none ("": layers or nodes).
enum class ModelPreset { none, gpt, resnet };
inline constexpr ChoiceTable<ModelPreset, 3> kModelPresets{
    {{"", ModelPreset::none}, {"gpt", ModelPreset::gpt}, {"resnet", ModelPreset::resnet}}};

// model.resnet.block: torchvision's BasicBlock or Bottleneck.
enum class ResNetBlock { basic, bottleneck };
inline constexpr ChoiceTable<ResNetBlock, 2> kResNetBlocks{
    {{"basic", ResNetBlock::basic}, {"bottleneck", ResNetBlock::bottleneck}}};

// model.resnet.stem: the CIFAR stem (3×3 conv) or the ImageNet one (7×7 conv and max pool).
enum class ResNetStem { cifar, imagenet };
inline constexpr ChoiceTable<ResNetStem, 2> kResNetStems{
    {{"cifar", ResNetStem::cifar}, {"imagenet", ResNetStem::imagenet}}};

}  // namespace mixtrain::core
