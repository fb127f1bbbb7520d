#include "replay/explain.h"

#include "replay/for_each_tensor.h"
#include "policy/byte_size.h"
#include "policy/text_format.h"
#include "replay/tracking_allocator.h"
#include "replay/written_arguments.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <sstream>

#include <sys/stat.h>
#include <unistd.h>

namespace hpac {
namespace {

std::string xmlEscape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string fixed(double v, int digits) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << v;
  return out.str();
}

}  // namespace

int64_t DecisionRecorder::count(Phase phase, const std::string& decision) const {
  return std::count_if(ops_.begin(), ops_.end(),
                       [&](const ExplainedOp& o) { return o.phase == phase && o.decision == decision; });
}

// Note [Explain's byte accounting]
// In the forward, every storage an op reads or writes is named (StorageIds).
// An op's output_bytes are the bytes of the storages its outputs hold that no
// earlier op of the region touched: a view or an in-place result of an input,
// of a parameter or of an earlier output costs nothing. A save's kept_bytes
// are what keep() makes live until the recompute beyond what earlier saves
// already keep: the storages of its returns not kept yet, and the snapshot of
// each tensor it wrote (an in-place or out= result, copied by keep()).
void DecisionRecorder::noteArguments(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const size_t num_args = op.schema().arguments().size();
  for (size_t i = stack.size() - num_args; i < stack.size(); ++i) {
    forEachTensor(stack[i], [&](const at::Tensor& t) {
      if (t.defined() && t.has_storage()) seen_.of(t);
    });
  }
}

void DecisionRecorder::record(ExplainedOp row, const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const bool counted = row.occurrence >= 0;
  if (row.phase == Phase::kForward && counted) {
    const bool saved = row.decision == "save";
    const auto& schema = op.schema();
    const size_t num_returns = schema.returns().size();
    for (size_t j = 0; j < num_returns; ++j) {
      const bool written = aliasedArgument(schema, j) >= 0;
      forEachTensor(stack[stack.size() - num_returns + j], [&](const at::Tensor& t) {
        if (!t.defined()) return;
        if (saved && (written || !t.has_storage())) row.kept_bytes += static_cast<int64_t>(t.nbytes());
        if (!t.has_storage()) {
          row.output_bytes += static_cast<int64_t>(t.nbytes());
          return;
        }
        bool first = false;
        const int64_t sid = seen_.of(t, &first);
        const auto bytes = static_cast<int64_t>(t.storage().nbytes());
        if (first) row.output_bytes += bytes;
        if (saved && !written && kept_.insert(sid).second) row.kept_bytes += bytes;
      });
    }
    forward_rows_[{row.op, row.occurrence}] = ops_.size();
  } else if (row.phase == Phase::kRecompute && counted && row.rule.empty()) {  // else the invocation said why
    const auto fwd = forward_rows_.find({row.op, row.occurrence});
    row.rule = fwd == forward_rows_.end()
                   ? std::string("not run by the forward (nothing saved to misalign)")
                   : "replays the forward's " + ops_[fwd->second].decision + " (" + ops_[fwd->second].rule + ")";
  }
  ops_.push_back(std::move(row));
}

TimelineCapture::TimelineCapture() {
  tracking_.emplace();
  TrackingAllocator& tracker = TrackingAllocator::instance();
  baseline_ = tracker.currentBytes();
  samples_.reserve(1 << 16);
  tracker.setTimeline(&samples_);
  active_ = true;
}

TimelineCapture::~TimelineCapture() {
  if (active_) TrackingAllocator::instance().setTimeline(nullptr);
}

void TimelineCapture::mark(const std::string& label) {
  marks_.emplace_back(label, static_cast<int64_t>(samples_.size()));
}

TimelineTrace TimelineCapture::finish(const std::string& mode) {
  TORCH_CHECK(active_, "hpac explain: TimelineCapture::finish called twice");
  TrackingAllocator::instance().setTimeline(nullptr);
  tracking_.reset();
  active_ = false;
  TimelineTrace trace;
  trace.mode = mode;
  trace.bytes.reserve(samples_.size());
  for (const int64_t s : samples_) {
    trace.bytes.push_back(s - baseline_);
    trace.peak_bytes = std::max(trace.peak_bytes, s - baseline_);
  }
  trace.marks = marks_;
  return trace;
}

std::string formatExplainTable(const ExplainReport& report, size_t max_rows) {
  std::ostringstream out;
  out << "hpac explain: " << report.source << "\n";
  out << "region " << report.region << ", mode " << report.mode << "\n\n";
  out << std::left << std::setw(10) << "phase" << std::setw(30) << "op" << std::right << std::setw(5) << "occ"
      << "  " << std::left << std::setw(10) << "decision" << std::right << std::setw(12) << "out bytes"
      << std::setw(12) << "kept bytes" << std::setw(10) << "us" << "  rule\n";
  size_t shown[2] = {0, 0}, hidden[2] = {0, 0};
  for (const ExplainedOp& o : report.ops) {
    const int p = static_cast<int>(o.phase);
    if (max_rows > 0 && shown[p] >= max_rows) {
      ++hidden[p];
      continue;
    }
    ++shown[p];
    out << std::left << std::setw(10) << toString(o.phase) << std::setw(30) << o.op << std::right << std::setw(5)
        << o.occurrence << "  " << std::left << std::setw(10) << o.decision << std::right << std::setw(12)
        << o.output_bytes << std::setw(12) << o.kept_bytes << std::setw(10) << fixed(o.micros, 1) << "  " << o.rule
        << "\n";
  }
  for (int p = 0; p < 2; ++p) {
    if (hidden[p] > 0) out << "... " << hidden[p] << " more " << toString(static_cast<Phase>(p)) << " rows (JSON has all)\n";
  }
  int64_t kept = 0;
  double forward_us = 0, recompute_us = 0;
  int64_t n[2][4] = {};  // phase x {save/serve, recompute, ignore, skip}
  for (const ExplainedOp& o : report.ops) {
    const int p = static_cast<int>(o.phase);
    kept += o.kept_bytes;
    (o.phase == Phase::kForward ? forward_us : recompute_us) += o.micros;
    const int d = (o.decision == "save" || o.decision == "serve") ? 0
                  : o.decision == "recompute"                      ? 1
                  : o.decision == "skip"                           ? 3
                                                                   : 2;
    ++n[p][d];
  }
  const InvocationStats& s = report.stats;
  out << "\nforward: " << n[0][0] << " saved, " << n[0][1] << " recomputed later, " << n[0][2] << " ignored; kept "
      << formatBytes(kept) << "; " << fixed(forward_us, 1) << " us\n";
  out << "recompute: " << n[1][0] << " served, " << n[1][1] << " re-run, " << n[1][3] << " skipped, " << n[1][2]
      << " ignored; " << fixed(recompute_us, 1) << " us\n";
  out << "invocation stats: saved " << s.saved << ", served " << s.served << ", recomputed " << s.recomputed
      << ", skipped " << s.skipped << ", unserved " << s.unserved << "\n";
  if (!report.timelines.empty()) {
    out << "\npeak tensor bytes over the step (above the bytes alive before it):\n";
    for (const TimelineTrace& t : report.timelines) {
      out << "  " << std::left << std::setw(10) << t.mode << std::right << std::setw(14) << formatBytes(t.peak_bytes)
          << "  (" << t.bytes.size() << " allocator events)\n";
    }
  }
  return out.str();
}

std::string explainJson(const ExplainReport& report) {
  std::ostringstream out;
  out << "{\n  \"schema\": \"hpac.explain/1\",\n";
  out << "  \"source\": " << jsonString(report.source) << ",\n";
  out << "  \"region\": " << jsonString(report.region) << ",\n";
  out << "  \"mode\": " << jsonString(report.mode) << ",\n";
  const InvocationStats& s = report.stats;
  out << "  \"stats\": {\"ops_forward\": " << s.ops_forward << ", \"ops_recompute\": " << s.ops_recompute
      << ", \"saved\": " << s.saved << ", \"saved_bytes\": " << s.saved_bytes << ", \"served\": " << s.served
      << ", \"recomputed\": " << s.recomputed << ", \"skipped\": " << s.skipped << ", \"ignored\": " << s.ignored
      << ", \"unserved\": " << s.unserved
      << "},\n";
  out << "  \"ops\": [";
  for (size_t i = 0; i < report.ops.size(); ++i) {
    const ExplainedOp& o = report.ops[i];
    out << (i ? ",\n    " : "\n    ") << "{\"phase\": " << jsonString(toString(o.phase))
        << ", \"op\": " << jsonString(o.op) << ", \"occurrence\": " << o.occurrence
        << ", \"decision\": " << jsonString(o.decision) << ", \"answer\": " << jsonString(o.answer)
        << ", \"rule\": " << jsonString(o.rule) << ", \"output_bytes\": " << o.output_bytes
        << ", \"kept_bytes\": " << o.kept_bytes << ", \"micros\": " << fixed(o.micros, 3) << "}";
  }
  out << (report.ops.empty() ? "],\n" : "\n  ],\n");
  out << "  \"timeline\": [";
  for (size_t i = 0; i < report.timelines.size(); ++i) {
    const TimelineTrace& t = report.timelines[i];
    out << (i ? ",\n    " : "\n    ") << "{\"mode\": " << jsonString(t.mode) << ", \"peak_bytes\": " << t.peak_bytes
        << ", \"marks\": {";
    for (size_t m = 0; m < t.marks.size(); ++m) {
      out << (m ? ", " : "") << jsonString(t.marks[m].first) << ": " << t.marks[m].second;
    }
    out << "}, \"bytes\": [";
    for (size_t b = 0; b < t.bytes.size(); ++b) out << (b ? "," : "") << t.bytes[b];
    out << "]}";
  }
  out << (report.timelines.empty() ? "]\n" : "\n  ]\n") << "}\n";
  return out.str();
}

// Note [Timeline SVG]
// x: allocator events from the start of the step (a mode that recomputes has
// more of them, so its line is longer); y: tensor bytes alive above the
// step's start. A line with more points than the plot has pixels keeps, per
// pixel column, its first, lowest, highest and last value, so peaks survive.
namespace {

constexpr double kSvgWidth = 900, kSvgHeight = 440, kSvgLeft = 80, kSvgRight = 170, kSvgTop = 40, kSvgBottom = 60;
constexpr double kPlotW = kSvgWidth - kSvgLeft - kSvgRight, kPlotH = kSvgHeight - kSvgTop - kSvgBottom;

// The plot's scales: allocator events to x and bytes to y, so the longest trace and the most bytes fill the plot.
struct TimelineScale {
  explicit TimelineScale(const std::vector<TimelineTrace>& timelines) {
    size_t longest = 1;
    for (const TimelineTrace& t : timelines) {
      longest = std::max(longest, t.bytes.size());
      for (const int64_t b : t.bytes) top = std::max(top, b);
    }
    x_scale = kPlotW / static_cast<double>(longest);
    y_scale = kPlotH / static_cast<double>(top);
  }
  double px(double i) const { return kSvgLeft + i * x_scale; }
  double py(double b) const { return kSvgTop + kPlotH - std::max(0.0, b) * y_scale; }

  int64_t top = 1;  // the most bytes of any trace, at least 1
  double x_scale = 0, y_scale = 0;
};

// The document's head, the title, the plot's frame, the bytes axis (five ticks, 0 to the most bytes) and both axes'
// labels.
void svgAxes(std::ostringstream& out, const TimelineScale& s, const std::string& title) {
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kSvgWidth << "\" height=\"" << kSvgHeight
      << "\" viewBox=\"0 0 " << kSvgWidth << " " << kSvgHeight << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  out << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  out << "<text x=\"" << kSvgLeft << "\" y=\"22\" font-size=\"14\">" << xmlEscape(title) << "</text>\n";
  out << "<g stroke=\"#888\" fill=\"none\"><rect x=\"" << kSvgLeft << "\" y=\"" << kSvgTop << "\" width=\"" << kPlotW
      << "\" height=\"" << kPlotH << "\"/></g>\n";
  for (int k = 0; k <= 4; ++k) {
    const double b = static_cast<double>(s.top) * k / 4;
    const double y = s.py(b);
    out << "<line x1=\"" << kSvgLeft - 4 << "\" y1=\"" << fixed(y, 1) << "\" x2=\"" << kSvgLeft + kPlotW << "\" y2=\""
        << fixed(y, 1) << "\" stroke=\"#ddd\"/>\n";
    out << "<text x=\"" << kSvgLeft - 6 << "\" y=\"" << fixed(y + 4, 1) << "\" text-anchor=\"end\">"
        << xmlEscape(formatBytes(static_cast<int64_t>(b))) << "</text>\n";
  }
  out << "<text x=\"" << kSvgLeft + kPlotW / 2 << "\" y=\"" << kSvgHeight - 20
      << "\" text-anchor=\"middle\">allocator events over one step: forward, then backward (with recompute)</text>\n";
  out << "<text x=\"18\" y=\"" << kSvgTop + kPlotH / 2 << "\" text-anchor=\"middle\" transform=\"rotate(-90 18 "
      << kSvgTop + kPlotH / 2 << ")\">tensor bytes alive</text>\n";
}

// The events of `bytes` the line is drawn through, in order: per pixel column its first, lowest, highest and last
// (Note [Timeline SVG]).
std::vector<size_t> pointsDrawn(const TimelineScale& s, const std::vector<int64_t>& bytes) {
  std::vector<size_t> drawn;
  const size_t n = bytes.size();
  size_t j = 0;
  while (j < n) {
    const auto column = static_cast<int64_t>(s.px(static_cast<double>(j)));
    size_t end = j;
    int64_t lo = bytes[j], hi = bytes[j];
    size_t lo_at = j, hi_at = j;
    while (end < n && static_cast<int64_t>(s.px(static_cast<double>(end))) == column) {
      if (bytes[end] < lo) {
        lo = bytes[end];
        lo_at = end;
      }
      if (bytes[end] > hi) {
        hi = bytes[end];
        hi_at = end;
      }
      ++end;
    }
    std::vector<size_t> keep = {j, lo_at, hi_at, end - 1};
    std::sort(keep.begin(), keep.end());
    keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
    drawn.insert(drawn.end(), keep.begin(), keep.end());
    j = end;
  }
  return drawn;
}

// One mode's line and its marks (dashed, the mark's label as a tooltip).
void svgTrace(std::ostringstream& out, const TimelineScale& s, const TimelineTrace& t, const char* color) {
  out << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"1.5\" points=\"";
  for (const size_t k : pointsDrawn(s, t.bytes)) {
    out << fixed(s.px(static_cast<double>(k)), 1) << "," << fixed(s.py(static_cast<double>(t.bytes[k])), 1) << " ";
  }
  out << "\"/>\n";
  for (const auto& [label, at] : t.marks) {
    const double x = s.px(static_cast<double>(at));
    out << "<line x1=\"" << fixed(x, 1) << "\" y1=\"" << kSvgTop << "\" x2=\"" << fixed(x, 1) << "\" y2=\""
        << kSvgTop + kPlotH << "\" stroke=\"" << color << "\" stroke-dasharray=\"4 3\" opacity=\"0.6\"><title>"
        << xmlEscape(t.mode + ": " + label) << "</title></line>\n";
  }
}

// The `index`th entry of the legend right of the plot: the mode's color, its name and its peak.
void svgLegendEntry(std::ostringstream& out, const TimelineTrace& t, size_t index, const char* color) {
  const double ly = kSvgTop + 16 + 34 * static_cast<double>(index);
  out << "<line x1=\"" << kSvgLeft + kPlotW + 12 << "\" y1=\"" << ly << "\" x2=\"" << kSvgLeft + kPlotW + 36
      << "\" y2=\"" << ly << "\" stroke=\"" << color << "\" stroke-width=\"2\"/>\n";
  out << "<text x=\"" << kSvgLeft + kPlotW + 42 << "\" y=\"" << ly + 4 << "\">" << xmlEscape(t.mode) << "</text>\n";
  out << "<text x=\"" << kSvgLeft + kPlotW + 42 << "\" y=\"" << ly + 18 << "\" fill=\"#555\">peak "
      << xmlEscape(formatBytes(t.peak_bytes)) << "</text>\n";
}

}  // namespace

std::string timelineSvg(const std::vector<TimelineTrace>& timelines, const std::string& title) {
  static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
  const TimelineScale scale(timelines);
  std::ostringstream out;
  svgAxes(out, scale, title);
  for (size_t i = 0; i < timelines.size(); ++i) {
    const char* color = kColors[i % (sizeof kColors / sizeof kColors[0])];
    svgTrace(out, scale, timelines[i], color);
    svgLegendEntry(out, timelines[i], i, color);
  }
  out << "<text x=\"" << kSvgLeft + kPlotW + 12 << "\" y=\"" << kSvgTop + kPlotH
      << "\" fill=\"#555\">dashed: backward begins</text>\n";
  out << "</svg>\n";
  return out.str();
}

void checkWritablePath(const std::string& path, const char* what) {
  TORCH_CHECK(!path.empty(), "hpac explain: the ", what, " path is empty; give a file path");
  const size_t slash = path.find_last_of('/');
  const std::string folder = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  struct stat st {};
  TORCH_CHECK(::stat(folder.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "hpac explain: cannot write the ", what,
              " file '", path, "': its folder '", folder, "' does not exist; give a path in an existing, writable "
              "folder");
  TORCH_CHECK(::access(folder.c_str(), W_OK) == 0, "hpac explain: cannot write the ", what, " file '", path,
              "': its folder '", folder, "' is not writable; give a path in an existing, writable folder");
}

void writeTextFile(const std::string& path, const std::string& text, const char* what) {
  std::ofstream file(path, std::ios::out | std::ios::trunc);
  TORCH_CHECK(file.good(), "hpac explain: cannot write the ", what, " file '", path, "' (", std::strerror(errno),
              "); give a path in an existing, writable folder");
  file << text;
  file.close();
  TORCH_CHECK(!file.fail(), "hpac explain: writing the ", what, " file '", path, "' failed (",
              std::strerror(errno), ")");
}

}  // namespace hpac
