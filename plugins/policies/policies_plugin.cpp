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
  return {recipe_component<mixtrain::policies::kFp32Recipe>()};
}

}  // namespace

MIXTRAIN_PLUGIN("policies", "0.1.0", policy_components)
