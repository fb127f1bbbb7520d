// Container discovery: every zoo model, every registry entry shape, the
// heuristics and their limits, retrieval wrappers, and the registry file.
#include "tools/trainer/discovery.h"
#include "tools/trainer/registry.h"
#include "tools/trainer/zoo_common.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>

#include <set>
#include <sstream>

namespace hpac::trainer {
namespace {

const ModelRegistry& registry() {
  const auto& r = builtinRegistry();
  EXPECT_TRUE(r.ok()) << r.status().message();
  return *r;
}

struct Block : torch::nn::Module {
  explicit Block(int64_t width) : torch::nn::Module("Block") {
    register_module("proj", torch::nn::Linear(width, width));
  }
};

// Creates (or finds) the chain of plain modules along `path` below `root` and
// puts a ModuleList of `n` blocks at its end.
void addList(torch::nn::Module& root, const std::string& path, int n, int64_t width = 4) {
  torch::nn::Module* at = &root;
  std::stringstream parts(path);
  std::string part;
  std::vector<std::string> names;
  while (std::getline(parts, part, '.')) names.push_back(part);
  for (size_t i = 0; i + 1 < names.size(); ++i) {
    const auto children = at->named_children();
    const auto* existing = children.find(names[i]);
    at = existing ? existing->get() : at->register_module(names[i], std::make_shared<torch::nn::Module>("Node")).get();
  }
  torch::nn::ModuleList list;
  for (int i = 0; i < n; ++i) list->push_back(std::make_shared<Block>(width));
  at->register_module(names.back(), list);
}

Discovery discover(torch::nn::Module& root) {
  auto d = discoverLayers(root, registry());
  EXPECT_TRUE(d.ok()) << d.status().message();
  return d.ok() ? *d : Discovery{};
}

TEST(TrainerRegistry, ShippedRegistryCoversTheFamilies) {
  const ModelRegistry& r = registry();
  std::set<std::string> families;
  for (const auto& [cls, entry] : r.models) families.insert(entry.family);
  for (const char* f : {"Gemma3", "Gemma4", "Qwen2-VL", "Qwen2.5-VL", "Qwen3.5", "Qwen3-VL", "LLaVA", "Mistral3",
                        "Ministral3", "Llama4", "Llama-Nemotron-VL", "SmolVLM", "Kimi-VL", "MiniMax-M3", "Step3.7",
                        "Bagel", "Nemotron-H", "GPT-2"}) {
    EXPECT_TRUE(families.count(f)) << "registry lacks family " << f;
  }
  EXPECT_EQ(r.default_paths, (std::vector<std::string>{"model.layers", "layers"}));
  EXPECT_EQ(r.aliases.mlp, (std::vector<std::string>{"mlp", "feed_forward", "ffn"}));
  EXPECT_EQ(r.aliases.attention, (std::vector<std::string>{"self_attn", "attention", "attn", "linear_attn"}));
  EXPECT_EQ(r.aliases.norm1, (std::vector<std::string>{"input_layernorm", "attention_norm", "layer_norm1", "norm1"}));
  EXPECT_EQ(r.aliases.norm2,
            (std::vector<std::string>{"post_attention_layernorm", "ffn_norm", "layer_norm2", "norm2"}));
  EXPECT_EQ(r.aliases.mtp, (std::vector<std::string>{"mlp_moe_gen", "input_layernorm_moe_gen",
                                                     "post_attention_layernorm_moe_gen"}));
}

TEST(TrainerRegistry, RejectsMalformedRegistries) {
  const std::string head = "default_paths: [model.layers]\naliases: {mlp: [mlp]}\n";
  struct Case {
    std::string text, expect;
  } cases[] = {
      {head + "models:\n  - {class: A, family: F, language: [a.layers], visoin: [b]}\n", "unknown key 'visoin'"},
      {head + "models:\n  - {class: A, family: F, language: [a.layers]}\n  - {class: A, family: G, language: [x]}\n",
       "'A' is listed twice"},
      {head + "models:\n  - {class: A, family: F, language: []}\n", "empty list"},
      {head + "models:\n  - {class: A, family: F, language: [a..layers]}\n", "'a..layers' is not a module path"},
      {head + "models:\n  - {class: A, family: F}\n", "language: missing"},
      {"aliases: {mlp: [mlp]}\nmodels: []\n", "default_paths: missing"},
      {head + "models:\n  - {class: A, family: F, language: [x]}\nextra: 1\n", "unknown key 'extra'"},
  };
  for (const Case& c : cases) {
    auto r = parseRegistry(c.text, "reg.yaml");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.status().message().find("reg.yaml:"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << r.status().message();
  }
}

// Trees written by hand as Hugging Face transformers (4.52+) lays these
// classes out, with distractor containers beside the decoder: the registry
// must find the decoder and vision layers where the real classes keep them.
// The expected paths are NOT read from the registry (a wrong registry path
// fails here; EveryRegistryEntryShape below checks the discovery mechanics).
TEST(TrainerRegistry, FindsTheLayersOfHandWrittenTransformersTrees) {
  struct Case {
    std::string cls;
    std::string language;  // decoder layers as the class has them
    std::string vision;    // "" for text-only
  } cases[] = {
      {"LlavaForConditionalGeneration", "model.language_model.layers", "model.vision_tower.vision_model.encoder.layers"},
      {"Gemma3ForConditionalGeneration", "model.language_model.layers",
       "model.vision_tower.vision_model.encoder.layers"},
      {"Qwen2VLForConditionalGeneration", "model.language_model.layers", "model.visual.blocks"},
      {"Qwen2_5_VLForConditionalGeneration", "model.language_model.layers", "model.visual.blocks"},
      {"Qwen3VLForConditionalGeneration", "model.language_model.layers", "model.visual.blocks"},
      {"Mistral3ForConditionalGeneration", "model.language_model.layers", "model.vision_tower.transformer.layers"},
      {"SmolVLMForConditionalGeneration", "model.text_model.layers", "model.vision_model.encoder.layers"},
      {"Gemma3ForCausalLM", "model.layers", ""},
      {"GPT2LMHeadModel", "transformer.h", ""},
  };
  for (const Case& c : cases) {
    torch::nn::Module root(c.cls);
    addList(root, c.language, 3);
    if (!c.vision.empty()) addList(root, c.vision, 2);
    addList(root, "model.multi_modal_projector.extra", 5);  // a larger list that is not the decoder
    const Discovery d = discover(root);
    ASSERT_NE(d.language(), nullptr) << c.cls;
    EXPECT_EQ(d.language()->path, c.language) << c.cls;
    EXPECT_EQ(d.language()->layers.size(), 3u) << c.cls;
    if (c.vision.empty()) {
      EXPECT_EQ(d.vision(), nullptr) << c.cls;
    } else {
      ASSERT_NE(d.vision(), nullptr) << c.cls;
      EXPECT_EQ(d.vision()->path, c.vision) << c.cls;
      EXPECT_EQ(d.vision()->layers.size(), 2u) << c.cls;
    }
  }
}

// Every registry entry: each listed path (language and vision) on its own is
// found with the right role, and with all paths present the first one wins.
// (The paths come from the registry itself: this checks the discovery
// mechanics for every entry shape, not that the paths are right.)
TEST(TrainerDiscovery, EveryRegistryEntryShape) {
  for (const auto& [cls, entry] : registry().models) {
    for (size_t i = 0; i < entry.language.size(); ++i) {
      torch::nn::Module root(cls);
      addList(root, entry.language[i], 3);
      if (!entry.vision.empty()) addList(root, entry.vision.back(), 2);
      const Discovery d = discover(root);
      ASSERT_NE(d.language(), nullptr) << cls;
      EXPECT_EQ(d.language()->path, entry.language[i]) << cls;
      EXPECT_EQ(d.language()->layers.size(), 3u) << cls;
      EXPECT_NE(d.how.find("registry: " + cls), std::string::npos) << d.how;
      if (!entry.vision.empty()) {
        ASSERT_NE(d.vision(), nullptr) << cls;
        EXPECT_EQ(d.vision()->path, entry.vision.back()) << cls;
      }
    }
    torch::nn::Module all(cls);
    for (const std::string& p : entry.language) addList(all, p, 2);
    EXPECT_EQ(discover(all).language()->path, entry.language.front()) << cls;
  }
}

TEST(TrainerDiscovery, RegisteredModelsNeverFallBackToHeuristics) {
  torch::nn::Module root("LlavaForConditionalGeneration");
  addList(root, "model.layers", 4);  // a default path exists, but the class is registered
  auto d = discoverLayers(root, registry());
  ASSERT_FALSE(d.ok());
  const std::string m(d.status().message());
  EXPECT_NE(m.find("Registered models do not fall back"), std::string::npos) << m;
  EXPECT_NE(m.find("model.language_model.layers, language_model.model.layers"), std::string::npos) << m;
}

TEST(TrainerDiscovery, DefaultPathsInOrder) {
  torch::nn::Module a("Unregistered");
  addList(a, "model.layers", 2);
  addList(a, "layers", 5);
  EXPECT_EQ(discover(a).language()->path, "model.layers");

  torch::nn::Module b("Unregistered");
  addList(b, "model.layers", 0);  // empty: not a container
  addList(b, "layers", 2);
  const Discovery d = discover(b);
  EXPECT_EQ(d.language()->path, "layers");
  EXPECT_EQ(d.how, "default path layers");
}

TEST(TrainerDiscovery, LargestContainerAndNumericModuleDict) {
  torch::nn::Module root("Unregistered");
  addList(root, "encoder.small", 6, 2);   // more entries, fewer parameters
  addList(root, "decoder.blocks", 2, 16);
  Discovery d = discover(root);
  EXPECT_EQ(d.language()->path, "decoder.blocks");
  EXPECT_NE(d.how.find("largest container decoder.blocks"), std::string::npos);

  // A non-numeric ModuleDict is never taken, however large; a numeric one is.
  torch::nn::Module dicts("Unregistered");
  torch::nn::ModuleDict named, numeric;
  named->update({{"lm", std::make_shared<Block>(64)}, {"cls", std::make_shared<Block>(64)}});
  numeric->update({{"4", std::make_shared<Block>(4)}, {"5", std::make_shared<Block>(4)}});
  dicts.register_module("heads", named);
  dicts.register_module("stage", numeric);
  d = discover(dicts);
  EXPECT_EQ(d.language()->path, "stage");
  ASSERT_EQ(d.language()->layers.size(), 2u);
  EXPECT_EQ(d.language()->layers[0].index, 4);
  EXPECT_EQ(d.language()->layers[1].path, "stage.5");
}

TEST(TrainerDiscovery, NothingFoundListsPathsTried) {
  torch::nn::Module root("Unregistered");
  torch::nn::ModuleDict named;
  named->update({{"lm", std::make_shared<Block>(4)}});
  root.register_module("heads", named);
  auto d = discoverLayers(root, registry());
  ASSERT_FALSE(d.ok());
  const std::string m(d.status().message());
  EXPECT_NE(m.find("tried: model.layers, layers, largest ModuleList / numeric-key ModuleDict"), std::string::npos)
      << m;
}

TEST(TrainerDiscovery, RetrievalWrapperRecursesIntoInnerModel) {
  torch::nn::Module wrapper("BiEncoderModel");
  auto inner = wrapper.register_module("model", std::make_shared<torch::nn::Module>("GPT2LMHeadModel"));
  addList(*inner, "transformer.h", 3);
  const Discovery d = discover(wrapper);
  EXPECT_EQ(d.language()->path, "model.transformer.h");
  EXPECT_EQ(d.language()->layers[2].path, "model.transformer.h.2");
  EXPECT_NE(d.how.find("retrieval wrapper BiEncoderModel -> inner model 'model'"), std::string::npos) << d.how;

  torch::nn::Module empty("BiEncoderModel");
  auto e = discoverLayers(empty, registry());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("tried: encoder, model"), std::string::npos) << e.status().message();
}

// Every zoo model: where its layers are found and how.
TEST(TrainerDiscovery, EveryZooModel) {
  struct Case {
    const char* preset;
    const char* how;
    const char* language;
    size_t layers;
    const char* vision;
  } cases[] = {
      {"qwen3_moe_tiny", "default path model.layers", "model.layers", 4, nullptr},
      {"gpt2_tiny", "registry: GPT2LMHeadModel (family GPT-2)", "transformer.h", 2, nullptr},
      {"pipeline_stage_tiny", "default path model.layers", "model.layers", 2, nullptr},
      {"llava_tiny", "registry: LlavaForConditionalGeneration (family LLaVA)", "model.language_model.layers", 2,
       "model.vision_tower.vision_model.encoder.layers"},
      {"gemma3n_kv_tiny", "registry: Gemma3nForConditionalGeneration", "model.language_model.layers", 4, nullptr},
      {"bi_encoder_tiny", "retrieval wrapper BiEncoderModel -> inner model 'encoder'", "encoder.transformer.h", 2,
       nullptr},
      {"custom_blocks_tiny", "largest container backbone.blocks", "backbone.blocks", 3, nullptr},
  };
  for (const Case& c : cases) {
    auto spec = modelPreset(c.preset);
    ASSERT_TRUE(spec.ok());
    auto model = makeZooModel(*spec, 1);
    const Discovery d = discover(*model);
    EXPECT_NE(d.how.find(c.how), std::string::npos) << c.preset << ": " << d.how;
    ASSERT_NE(d.language(), nullptr) << c.preset;
    EXPECT_EQ(d.language()->path, c.language) << c.preset;
    EXPECT_EQ(d.language()->layers.size(), c.layers) << c.preset;
    for (const LayerRef& l : d.language()->layers) EXPECT_NE(l.checkpointable, nullptr) << l.path;
    if (c.vision) {
      ASSERT_NE(d.vision(), nullptr) << c.preset;
      EXPECT_EQ(d.vision()->path, c.vision);
    } else {
      EXPECT_EQ(d.vision(), nullptr) << c.preset;
    }
  }
  // The pipeline stage keeps its global layer indices.
  auto stage = makeZooModel(*modelPreset("pipeline_stage_tiny"), 1);
  const Discovery d = discover(*stage);
  EXPECT_EQ(d.language()->layers[0].index, 2);
  EXPECT_EQ(d.language()->layers[1].path, "model.layers.3");
}

}  // namespace
}  // namespace hpac::trainer
