#include "distributed/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "distributed/rank_agreement.h"
#include "mixtrain/core/graph/backend_needs.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

sdk::TensorView slice(sdk::TensorView v, std::int64_t offset, std::int64_t count) {
  return {static_cast<char*>(v.data) + offset * static_cast<std::int64_t>(sdk::dtype_size(v.dtype)),
          v.dtype, sdk::Shape{count}};
}

sdk::TensorView flat_of(sdk::TensorView v) {
  return {v.data, v.dtype, sdk::Shape{v.numel()}};
}

}  // namespace

DataParallel::DataParallel(std::shared_ptr<sdk::Communicator> communicator,
                           std::shared_ptr<sdk::DeviceBackend> backend,
                           DataParallelSettings settings)
    : comm_(std::move(communicator)), backend_(std::move(backend)), settings_(settings) {
  rank_ = comm_->rank();
  world_ = comm_->world_size();
}

void DataParallel::install_batch_norm_reducers(Model& model) {
  // Off while the hook is off: the non-finite replay runs each rank's own rows without
  // communicating, so there batch norm falls back to the rank's own statistics.
  auto reducer = [this](std::span<double> values) {
    if (hook_enabled_ && world_ > 1) comm_->all_reduce_host(values, sdk::ReduceOp::sum);
  };
  for (const auto& layer : model.layers()) {
    if (!layer->traits().reduces_statistics) continue;
    for (const BackendNeed& need : layer->synchronized_needs())
      if (auto why = unmet(*backend_, need))
        throw sdk::BackendError("[distributed] batch_norm = \"sync\": node '" + layer->name() +
                                    "' needs " + need_op_name(need) +
                                    ", which the backend does not provide: " + *why,
                                "use batch_norm = \"local\", or a backend whose batch_norm facet "
                                "is version 2 or later");
    layer->set_statistics_reducer(reducer);
  }
}

sdk::TensorView DataParallel::flat_view(const Bucket& b, std::int64_t offset,
                                        const sdk::Shape& shape) const {
  sdk::TensorView v = slice(b.flat.view(), offset, shape.numel());
  v.shape = shape;
  return v;
}

void DataParallel::attach(Model& model, std::vector<sdk::Parameter>& params,
                          std::vector<sdk::TensorView>& grads) {
  buckets_.clear();
  pieces_.clear();
  params_ = model.trainable_parameters();  // a frozen parameter has no gradient to reduce
  index_.clear();
  std::vector<std::int64_t> numels;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    index_[params_[i]] = i;
    numels.push_back(params_[i]->grad.view().numel());
  }
  const std::int64_t cap = std::max<std::int64_t>(1, settings_.bucket_bytes / 4);
  plan_ = plan_buckets(numels, cap, world_);
  bucket_of_.assign(params_.size(), 0);
  offset_of_.assign(params_.size(), 0);
  ready_.assign(params_.size(), false);
  for (std::size_t bi = 0; bi < plan_.size(); ++bi) {
    Bucket b;
    b.plan = plan_[bi];
    b.flat = Tensor(backend_, sdk::DType::fp32, sdk::Shape{b.plan.padded});
    backend_->fill(b.flat.view(), 0.0f);  // the padding stays zero
    if (sharded()) {
      b.shard = Tensor(backend_, sdk::DType::fp32, sdk::Shape{b.plan.shard()});
      backend_->fill(b.shard.view(), 0.0f);
    }
    for (std::size_t j = 0; j < b.plan.params.size(); ++j) {
      bucket_of_[b.plan.params[j]] = bi;
      offset_of_[b.plan.params[j]] = b.plan.offsets[j];
    }
    buckets_.push_back(std::move(b));
  }
  // Each parameter's gradient lives in its bucket (DDP's gradient_as_bucket_view): backward
  // writes straight into the buffer the collective reduces, with no copy and no second buffer.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const sdk::TensorView own = params_[i]->grad.view();
    const sdk::TensorView in_bucket = flat_view(buckets_[bucket_of_[i]], offset_of_[i], own.shape);
    backend_->copy(in_bucket, own);
    params_[i]->grad = Tensor::borrowed(in_bucket);
  }

  // What the optimizer is bound to (its state follows these views' sizes) and what the step
  // unscales and checks.
  std::vector<sdk::Parameter> bound;
  grads.clear();
  if (!sharded()) {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      sdk::Parameter p = params[i];
      p.tensors.grad = flat_view(buckets_[bucket_of_[i]], offset_of_[i], p.tensors.grad.shape);
      bound.push_back(p);
    }
    for (const auto& b : buckets_) grads.push_back(b.flat.view());
  } else {
    for (std::size_t bi = 0; bi < buckets_.size(); ++bi) {
      for (const ShardPiece& piece : shard_pieces(buckets_[bi].plan, rank_)) {
        const sdk::Parameter& whole = params[piece.param];
        sdk::Parameter p;
        p.name = whole.name;
        p.weight_decay = whole.weight_decay;
        p.tensors.master = slice(flat_of(whole.tensors.master), piece.param_offset, piece.count);
        p.tensors.grad = slice(buckets_[bi].shard.view(), piece.shard_offset, piece.count);
        // No working copy: gather_masters() refreshes every working copy from the whole masters.
        bound.push_back(p);
        pieces_.push_back({bi, piece});
      }
      grads.push_back(buckets_[bi].shard.view());
    }
  }
  params = std::move(bound);
  model.set_gradient_ready_hook([this](ModelParameter& p) { on_gradient_ready(p); });
  statistics_layers_ = 0;
  for (const auto& layer : model.layers()) statistics_layers_ += layer->traits().reduces_statistics;
  if (settings_.sync_batch_norm) install_batch_norm_reducers(model);
}

void DataParallel::begin_step() {
  for (auto& b : buckets_) {
    b.ready = 0;
    b.started = false;
    b.handle.reset();
  }
  std::fill(ready_.begin(), ready_.end(), false);
}

void DataParallel::mark_ready(std::size_t param) {
  ready_[param] = true;
  ++buckets_[bucket_of_[param]].ready;
}

void DataParallel::start(Bucket& b) {
  b.started = true;
  ++timing_.buckets;
  if (sharded())
    b.handle = comm_->start_reduce_scatter(b.flat.view(), b.shard.view(), sdk::ReduceOp::sum);
  else
    b.handle = comm_->start_all_reduce(b.flat.view(), sdk::ReduceOp::sum);
}

void DataParallel::on_gradient_ready(ModelParameter& p) {
  if (!hook_enabled_) return;
  const auto it = index_.find(&p);
  if (it == index_.end()) return;
  const std::size_t i = it->second;
  if (ready_[i]) return;
  mark_ready(i);
  Bucket& b = buckets_[bucket_of_[i]];
  // Buckets start in plan order on every rank: a bucket completed out of order waits for the
  // ones before it, so that every rank issues the same collectives in the same order.
  if (settings_.overlap && b.ready == b.plan.params.size()) {
    for (auto& earlier : buckets_) {
      if (earlier.started) continue;
      if (earlier.ready != earlier.plan.params.size()) break;
      start(earlier);
      ++timing_.started_in_backward;
    }
  }
  comm_->progress();
}

void DataParallel::finish_gradients() {
  // Gradients the hook did not see (hook off, or a parameter no node wrote this step) count as
  // ready now: they are in their bucket already.
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (!ready_[i]) mark_ready(i);
  for (auto& b : buckets_)
    if (!b.started) start(b);
  const auto t = Clock::now();
  for (auto& b : buckets_) b.handle->wait();
  timing_.wait_seconds += seconds_since(t);
}

DataParallel::Totals DataParallel::reduce_totals(bool found_inf, double sum_squares, double loss) {
  // Unsharded, every rank holds the same reduced gradients and the same Σg²: rank 0's is sent
  // alone, so the total is that value exactly. Sharded, the shards' sums add up.
  double values[3] = {found_inf ? 1.0 : 0.0, sharded() || rank_ == 0 ? sum_squares : 0.0, loss};
  comm_->all_reduce_host(values, sdk::ReduceOp::sum);
  Totals t;
  t.found_inf = values[0] > 0.0;
  t.sum_squares = values[1];
  t.loss = values[2] / static_cast<double>(world_);
  return t;
}

void DataParallel::gather_masters(Model& model) {
  const auto t = Clock::now();
  // Each rank's updated pieces into its shard buffer, then every shard to every rank.
  for (const Piece& p : pieces_) {
    const sdk::TensorView master = flat_of(params_[p.where.param]->master.view());
    backend_->copy(slice(buckets_[p.bucket].shard.view(), p.where.shard_offset, p.where.count),
                   slice(master, p.where.param_offset, p.where.count));
  }
  std::vector<sdk::CommunicationHandlePtr> handles;
  for (auto& b : buckets_)
    handles.push_back(comm_->start_all_gather(b.shard.view(), b.flat.view()));
  for (auto& h : handles) h->wait();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const sdk::TensorView master = params_[i]->master.view();
    backend_->copy(master, flat_view(buckets_[bucket_of_[i]], offset_of_[i], master.shape));
  }
  model.refresh_working_copies();
  timing_.gather_seconds += seconds_since(t);
}

void DataParallel::max_reduce(std::span<float> values) {
  if (values.empty()) return;
  std::vector<double> wide(values.begin(), values.end());
  comm_->all_reduce_host(wide, sdk::ReduceOp::max);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(wide[i]);
}

void DataParallel::broadcast_buffers(Model& model) {
  for (auto* b : model.buffers()) comm_->broadcast(b->value.view(), 0);
}

std::vector<std::string> DataParallel::optimizer_slots(const sdk::Optimizer& optimizer) {
  if (!sharded())
    throw std::logic_error("optimizer_slots: unsharded, every rank holds the whole state");
  // The slot names: "<param>.<slot>" for each bound piece; rank 0 holds a piece of every bucket,
  // so its list of slots is everyone's.
  std::string slots;
  if (rank_ == 0 && !pieces_.empty()) {
    const std::string prefix = params_[pieces_.front().where.param]->name + ".";
    for (const auto& t : optimizer.state_tensors())
      if (t.name.rfind(prefix, 0) == 0) slots += t.name.substr(prefix.size()) + "\n";
  }
  slots = lowest_rank_text(*comm_, slots).text;
  std::vector<std::string> names;
  for (std::size_t at = 0; at < slots.size();) {
    const auto end = slots.find('\n', at);
    names.push_back(slots.substr(at, end - at));
    at = end + 1;
  }
  return names;
}

void DataParallel::gather_slot_bucket(const sdk::Optimizer& optimizer, const std::string& slot,
                                      std::size_t bucket, std::vector<float>* host) {
  Bucket& b = buckets_.at(bucket);
  backend_->fill(b.shard.view(), 0.0f);
  std::unordered_map<std::string, sdk::TensorView> by_name;
  for (const auto& t : optimizer.state_tensors()) by_name[t.name] = t.view;
  for (const Piece& p : pieces_) {
    if (p.bucket != bucket) continue;
    const auto it = by_name.find(params_[p.where.param]->name + "." + slot);
    if (it == by_name.end() || it->second.dtype != sdk::DType::fp32)
      throw std::logic_error("gather_optimizer_state: no fp32 slot " + slot + " for " +
                             params_[p.where.param]->name);
    backend_->copy(slice(b.shard.view(), p.where.shard_offset, p.where.count), it->second);
  }
  comm_->all_gather(b.shard.view(), b.flat.view());
  if (host == nullptr) return;
  host->resize(static_cast<std::size_t>(b.plan.padded));
  backend_->copy_to_host(host->data(), b.flat.view());
}

sdk::StreamedTensor DataParallel::whole_slot(std::size_t param, const std::string& slot) const {
  const ModelParameter& p = *params_.at(param);
  return {p.name + "." + slot, sdk::DType::fp32, p.master.view().shape.to_vector()};
}

std::vector<sdk::HostTensor> DataParallel::gather_optimizer_state(const sdk::Optimizer& optimizer) {
  std::vector<sdk::HostTensor> out;
  std::vector<float> host;
  for (const auto& slot : optimizer_slots(optimizer)) {
    std::vector<sdk::HostTensor> whole(params_.size());
    for (std::size_t i = 0; i < whole.size(); ++i) {
      auto info = whole_slot(i, slot);
      whole[i].name = std::move(info.name);
      whole[i].dtype = info.dtype;
      whole[i].shape = std::move(info.shape);
      whole[i].bytes.resize(params_[i]->master.view().bytes());
    }
    for (std::size_t bucket = 0; bucket < buckets_.size(); ++bucket) {
      gather_slot_bucket(optimizer, slot, bucket, &host);
      const Bucket& b = buckets_[bucket];
      for (std::size_t j = 0; j < b.plan.params.size(); ++j) {
        auto& h = whole[b.plan.params[j]];
        std::memcpy(h.bytes.data(), host.data() + b.plan.offsets[j], h.bytes.size());
      }
    }
    for (auto& h : whole) out.push_back(std::move(h));
  }
  return out;
}

void DataParallel::load_optimizer_state(
    const sdk::Optimizer& optimizer,
    const std::function<const sdk::HostTensor*(const std::string&)>& find,
    const std::string& where) {
  const auto state = optimizer.state_tensors();
  std::unordered_map<std::string, const Piece*> piece_of;
  for (const Piece& p : pieces_) piece_of[params_[p.where.param]->name] = &p;
  for (const auto& t : state) {
    const sdk::HostTensor* h = find(t.name);
    if (h == nullptr)
      throw sdk::CheckpointError(where + ": no optimizer state '" + t.name + "'",
                                 "resume with the same optimizer as the original run");
    // "<param>.<slot>": the longest parameter name that prefixes it.
    const Piece* piece = nullptr;
    std::size_t best = 0;
    for (const auto& [name, p] : piece_of)
      if (name.size() > best && t.name.rfind(name + ".", 0) == 0) {
        piece = p;
        best = name.size();
      }
    if (piece == nullptr) throw std::logic_error("load_optimizer_state: no piece for " + t.name);
    const std::int64_t whole = params_[piece->where.param]->master.view().numel();
    if (h->dtype != sdk::DType::fp32 || h->numel() != whole ||
        h->bytes.size() != static_cast<std::size_t>(whole) * 4)
      throw sdk::CheckpointError(where + ": optimizer state '" + t.name + "' holds " +
                                     std::to_string(h->numel()) + " values, the parameter has " +
                                     std::to_string(whole),
                                 "resume with the same model as the original run");
    backend_->copy_from_host(t.view, h->bytes.data() + piece->where.param_offset * 4);
  }
}

bool DataParallel::ranks_agree(std::span<const std::byte> state) {
  const std::uint32_t crc = crc32_of(state);
  // A CRC-32 is exact in a double; the max and the min agree only when every rank's does.
  double v[2] = {static_cast<double>(crc), -static_cast<double>(crc)};
  comm_->all_reduce_host(v, sdk::ReduceOp::max);
  return v[0] == -v[1];
}

CommunicationTiming DataParallel::take_timing() {
  CommunicationTiming t = timing_;
  timing_ = {};
  return t;
}

}  // namespace mixtrain::core
