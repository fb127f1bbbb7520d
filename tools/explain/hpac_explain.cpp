// hpac-explain (`hpac explain`): for one checkpoint region of the demo's MoE
// block stack, prints what hpac did with each op and why (text, JSON), and
// writes the step's memory timeline per mode as SVG. docs/explain.md.
//
//   hpac-explain [--mode full|selective|budget] [--region N] [--blocks N] [--budget F]
//                [--modes off,full,selective,budget] [--json FILE] [--svg FILE] [--rows N] [--seed N]
//                [--batch N] [--seq N]
//
// Exit status: 0 ok; 2 bad command line (the message names the value and what
// is allowed) or a file that cannot be written.
#include "replay/explain.h"
#include "tools/explain/explain_moe.h"
#include "plugin/version_line.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

namespace {

const char* kUsage =
    "usage: hpac-explain [--mode full|selective|budget] [--region N] [--blocks N] [--budget F]\n"
    "                    [--modes LIST] [--json FILE] [--svg FILE] [--rows N] [--seed N] [--batch N] [--seq N]\n"
    "                    [--version]\n"
    "  --mode    the mode whose decisions are explained (default selective)\n"
    "  --region  the block explained: 0 .. blocks-1 (default 0)\n"
    "  --blocks  blocks in the stack (default 2)\n"
    "  --budget  budget mode: fraction in [0, 1] of what a region keeps under off (default 0.5)\n"
    "  --modes   the timeline's modes, comma-separated (default off,full,selective,budget)\n"
    "  --json    write the report as JSON (docs/explain.md describes the fields)\n"
    "  --svg     write the memory timeline as SVG\n"
    "  --rows    print at most N rows per phase (default all; the JSON has all)\n"
    "  --batch, --seq  input shape [batch, seq, 64] (default 2 x 16)\n"
    "  --seed    seed of the parameters, input and dropout (default 0)";

int fail(const std::string& message) {
  std::cerr << "hpac-explain: " << message << "\n";
  return 2;
}

bool parseInt(const std::string& text, int64_t* out) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end == text.c_str() || *end != '\0') return false;
  *out = v;
  return true;
}

}  // namespace

int main(int argc, char** argv) try {
  hpac::MoeExplainOptions options;
  std::string json_path, svg_path;
  int64_t rows = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (hpac::printedHelpOrVersion(flag, "hpac-explain", kUsage)) return 0;
    if (i + 1 >= argc) return fail("unknown argument or missing value: '" + flag + "'\n" + kUsage);
    const std::string v = argv[++i];
    int64_t n = 0;
    if (flag == "--mode") {
      options.mode = v;
    } else if (flag == "--region" || flag == "--blocks" || flag == "--rows" || flag == "--seed" || flag == "--batch" ||
               flag == "--seq") {
      if (!parseInt(v, &n)) return fail(flag + " '" + v + "' is not an integer");
      if (flag == "--region") options.region = n;
      if (flag == "--blocks") options.blocks = n;
      if (flag == "--batch") options.batch = n;
      if (flag == "--seq") options.seq = n;
      if (flag == "--rows") {
        if (n < 0) return fail("--rows " + v + " is negative; allowed: 0 (all) or a positive integer");
        rows = n;
      }
      if (flag == "--seed") options.seed = static_cast<uint64_t>(n);
    } else if (flag == "--budget") {
      char* end = nullptr;
      options.budget = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0') return fail("--budget '" + v + "' is not a number; allowed: a fraction in [0, 1]");
    } else if (flag == "--modes") {
      options.timeline_modes.clear();
      size_t start = 0;
      while (start <= v.size()) {
        const size_t comma = v.find(',', start);
        options.timeline_modes.push_back(v.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (flag == "--json") {
      json_path = v;
    } else if (flag == "--svg") {
      svg_path = v;
    } else {
      return fail("unknown argument '" + flag + "'\n" + kUsage);
    }
  }
  if (!json_path.empty()) hpac::checkWritablePath(json_path, "JSON");
  if (!svg_path.empty()) hpac::checkWritablePath(svg_path, "SVG");
  const hpac::ExplainReport report = hpac::explainMoeBlocks(options);
  // Files first: an unwritable path fails before the table is printed.
  if (!json_path.empty()) hpac::writeTextFile(json_path, hpac::explainJson(report), "JSON");
  if (!svg_path.empty()) {
    hpac::writeTextFile(svg_path, hpac::timelineSvg(report.timelines, "hpac explain: " + report.source), "SVG");
  }
  std::cout << hpac::formatExplainTable(report, static_cast<size_t>(rows));
  return 0;
} catch (const c10::Error& e) {
  return fail(e.what_without_backtrace());
} catch (const std::exception& e) {
  return fail(e.what());
}
