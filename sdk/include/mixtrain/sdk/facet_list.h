// The facets this SDK defines, as one type list: the single registry of facets. Adding a facet is
// its header (backend_<facet>.h), its implementations, and one line here (its include and its
// entry). The host generates from it what it keeps per facet: the ops a plan may need
// (BackendNeed), the facets it binds once per plan (BoundFacets), their profiling.
//
// Contract
// - Every entry derives from Facet and declares kName and kVersion (facet.h); an entry whose host
//   plans its calls also declares `using Op` (its op enum, with op_name and op_signature).
// - Order is the index a host binds them at; it means nothing to a backend, which answers
//   find_facet by name. Not part of any ABI digest: it changes when a facet is added and no
//   existing declaration does.
#pragma once

#include <cstddef>
#include <type_traits>

#include "mixtrain/sdk/backend_activation.h"
#include "mixtrain/sdk/backend_attention.h"
#include "mixtrain/sdk/backend_batch_norm.h"
#include "mixtrain/sdk/backend_call_observer.h"
#include "mixtrain/sdk/backend_convolution.h"
#include "mixtrain/sdk/backend_dropout.h"
#include "mixtrain/sdk/backend_embedding.h"
#include "mixtrain/sdk/backend_foreach.h"
#include "mixtrain/sdk/backend_gemm.h"
#include "mixtrain/sdk/backend_gradient_check.h"
#include "mixtrain/sdk/backend_host_memory.h"
#include "mixtrain/sdk/backend_image_input.h"
#include "mixtrain/sdk/backend_kernel_trace.h"
#include "mixtrain/sdk/backend_layer_norm.h"
#include "mixtrain/sdk/backend_loss.h"
#include "mixtrain/sdk/backend_native_stream.h"
#include "mixtrain/sdk/backend_optimizer_updates.h"
#include "mixtrain/sdk/backend_plan_report.h"
#include "mixtrain/sdk/backend_quantized_weight.h"
#include "mixtrain/sdk/backend_residual.h"
#include "mixtrain/sdk/backend_scratch.h"
#include "mixtrain/sdk/backend_step_graph.h"

namespace mixtrain::sdk {

template <class... Fs>
struct FacetList {
  static constexpr std::size_t size = sizeof...(Fs);
  // The position of F in the list; a compile error when F is not in it.
  template <class F>
  static constexpr std::size_t index_of() {
    constexpr bool hits[] = {std::is_same_v<F, Fs>...};
    for (std::size_t i = 0; i < size; ++i)
      if (hits[i]) return i;
    throw "not a facet of this list";  // not a constant expression: fails the build
  }
};

using Facets = FacetList<GemmFacet,             //
                         ActivationFacet,       //
                         ResidualFacet,         //
                         GradientCheckFacet,    //
                         ForeachFacet,          //
                         LayerNormFacet,        //
                         BatchNormFacet,        //
                         LossFacet,             //
                         OptimizerFacet,        //
                         AttentionFacet,        //
                         EmbeddingFacet,        //
                         ConvolutionFacet,      //
                         DropoutFacet,          //
                         StepGraphFacet,        //
                         NativeStreamFacet,     //
                         CallObserverFacet,     //
                         ScratchFacet,          //
                         QuantizedWeightFacet,  //
                         ImageInputFacet,       //
                         PlanReportFacet,       //
                         KernelTraceFacet,      //
                         HostMemoryFacet>;

}  // namespace mixtrain::sdk
