// Seeded mutation fuzzing of the trainer's config and registry parsers: every
// mutated document must be accepted or rejected with a message that names the
// file, line and column — never a crash, an escaped exception, or a hang. And
// the step record's reader (policy/step_record.h): every mutated plan file is
// read (and then written and read back as the same text) or refused naming it.
// Deterministic (fixed seeds), bounded (kCases per corpus), runs in CI.
#include "test/support/source_dir.h"
#include "tools/trainer/config.h"
#include "tools/trainer/registry.h"
#include "policy/step_record.h"

#include <c10/util/Exception.h>

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>

namespace hpac {
namespace {

constexpr int kCases = 4000;

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One mutation: byte flip, deletion, insertion of a YAML-significant token,
// line duplication/swap, or truncation.
std::string mutate(const std::string& doc, std::mt19937_64& rng) {
  static const char* kTokens[] = {":", "-", " ", "\n", "\t", "{", "}", "[", "]", "\"", "'", "#", "&a", "*a", "!!str ",
                                  "off", "on", "yes", "~", "null", "1e400", "-7", "0x1F", "2-1", "\"0-99\"", "full",
                                  "selective", ": :", "- - -", "%YAML 1.1\n", "---\n", "...\n", "? ", "|", ">"};
  std::string s = doc;
  const int n = 1 + static_cast<int>(rng() % 4);
  for (int k = 0; k < n && !s.empty(); ++k) {
    const size_t pos = rng() % s.size();
    switch (rng() % 6) {
      case 0: s[pos] = static_cast<char>(rng() % 128); break;
      case 1: s.erase(pos, 1 + rng() % 12); break;
      case 2: s.insert(pos, kTokens[rng() % (sizeof(kTokens) / sizeof(*kTokens))]); break;
      case 3: {  // duplicate the line at pos
        const size_t b = s.rfind('\n', pos), e = s.find('\n', pos);
        const size_t from = b == std::string::npos ? 0 : b + 1;
        s.insert(from, s.substr(from, (e == std::string::npos ? s.size() : e + 1) - from));
        break;
      }
      case 4: s.resize(pos); break;
      default: {  // change the indentation of the line at pos
        const size_t b = s.rfind('\n', pos);
        s.insert(b == std::string::npos ? 0 : b + 1, std::string(1 + rng() % 3, ' '));
      }
    }
  }
  return s;
}

template <typename Parse>
void fuzz(const std::string& seed_doc, const std::string& file, uint64_t seed, Parse parse) {
  std::mt19937_64 rng(seed);
  const std::regex where(std::regex_replace(file, std::regex(R"([.])"), R"(\.)") + R"(:\d+:\d+)");
  int accepted = 0, rejected = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kCases; ++i) {
    const std::string doc = mutate(seed_doc, rng);
    std::string message;
    try {
      const auto status = parse(doc, file);
      if (status.ok()) {
        ++accepted;
        continue;
      }
      message = std::string(status.message());
    } catch (const std::exception& e) {
      ADD_FAILURE() << "case " << i << ": an exception escaped the parser: " << e.what() << "\n--- input ---\n" << doc;
      continue;
    }
    ++rejected;
    EXPECT_TRUE(std::regex_search(message, where))
        << "case " << i << ": rejection without file:line:col: " << message << "\n--- input ---\n" << doc;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << file << ": " << kCases << " mutated documents, " << accepted << " accepted, " << rejected
            << " rejected with file:line:col, " << seconds << " s\n";
  EXPECT_GT(rejected, kCases / 10);  // the mutations really exercise the error paths
}

TEST(Fuzz, TrainConfigParser) {
  const std::string doc = readFile(sourcePath("examples/training_demo/train.yaml"));
  ASSERT_TRUE(trainer::parseConfig(doc, "train.yaml").ok());
  fuzz(doc, "fuzz_train.yaml", 20261202, [](const std::string& text, const std::string& file) {
    return trainer::parseConfig(text, file).status();
  });
}

TEST(Fuzz, ModelRegistryParser) {
  const std::string doc = readFile(sourcePath("tools/trainer/model_registry.yaml"));
  ASSERT_TRUE(trainer::parseRegistry(doc, "model_registry.yaml").ok());
  fuzz(doc, "fuzz_registry.yaml", 7, [](const std::string& text, const std::string& file) {
    return trainer::parseRegistry(text, file).status();
  });
}

TEST(Fuzz, StepRecordReader) {
  const std::string doc = readFile(sourcePath("test/fuzz/corpus/step_record/plan_v2.json"));
  ASSERT_NO_THROW(readStepRecord(doc, "plan_v2.json"));
  std::mt19937_64 rng(20261207);
  int read = 0, refused = 0;
  for (int i = 0; i < kCases; ++i) {
    const std::string text = mutate(doc, rng);
    try {
      const std::string written = stepRecordJson(readStepRecord(text, "fuzz.json"));
      EXPECT_EQ(stepRecordJson(readStepRecord(written, "again.json")), written) << "case " << i << "\n" << text;
      ++read;
    } catch (const c10::Error& e) {
      const std::string message = e.what_without_backtrace();
      EXPECT_EQ(message.rfind("hpac: step record fuzz.json: ", 0), 0u) << "case " << i << ": " << message;
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "case " << i << ": an exception escaped the reader: " << e.what() << "\n--- input ---\n" << text;
    }
  }
  std::cout << "plan_v2.json: " << kCases << " mutated records, " << read << " read, " << refused << " refused\n";
  EXPECT_GT(refused, kCases / 10);
  EXPECT_GT(read, 0);
}

}  // namespace
}  // namespace hpac
