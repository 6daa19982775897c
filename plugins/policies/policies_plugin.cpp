// Descriptor of libmixtrain_policies: one component per recipe in policy_recipes.h.
#include "mixtrain/sdk/plugin.h"

#include "policy_recipes.h"
#include "table_precision_policy.h"

namespace {

template <const mixtrain::policies::PolicyRecipe& Recipe>
mixtrain::sdk::ComponentInfo recipe_component() {
  using Policy = mixtrain::policies::RecipePolicy<Recipe>;
  return {mixtrain::sdk::ComponentKind::policy, std::string(Recipe.name),
          std::string(Recipe.description), Policy::option_schema(),
          &mixtrain::sdk::make_component<Policy>};
}

std::vector<mixtrain::sdk::ComponentInfo> policy_components() {
  using namespace mixtrain::policies;
  return {
      recipe_component<kFp32Recipe>(),
      recipe_component<kTf32Recipe>(),
      recipe_component<kFp16MixedRecipe>(),
      recipe_component<kBf16MixedRecipe>(),
      {mixtrain::sdk::ComponentKind::policy, "auto",
       "bf16-mixed if the backend runs bf16 natively, else fp16-mixed if fp16, else fp32",
       AutoPrecisionPolicy::option_schema(), &mixtrain::sdk::make_component<AutoPrecisionPolicy>}};
}

}  // namespace

MIXTRAIN_PLUGIN("policies", "0.1.0", policy_components)
