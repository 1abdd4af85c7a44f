// RenderHtml of snapshot_views.h: one self-contained page, no external resources.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "tools/snapshot/snapshot_views.h"

namespace graphalloc::tools {
namespace {

std::string EscapeHtml(absl::string_view text) {
  return absl::StrReplaceAll(text, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}});
}

constexpr absl::string_view kStyle = R"(<style>
body { font-family: sans-serif; margin: 16px; color: #222; }
h1 { font-size: 18px; }
#controls { margin: 8px 0; }
#inspector { position: sticky; top: 0; background: #fffbe6; border: 1px solid #e0d090; padding: 6px 10px;
             min-height: 1.4em; white-space: pre-wrap; font-family: monospace; font-size: 12px; }
details pre { font-size: 12px; background: #f6f6f6; padding: 8px; overflow-x: auto; }
.dim { opacity: 0.15; }
</style>
)";

// Click a block to see it in the inspector; the filter dims blocks of other states.
constexpr absl::string_view kScript = R"(<script>
(function () {
  var inspector = document.getElementById('inspector');
  var blocks = document.querySelectorAll('rect.block');
  blocks.forEach(function (rect) {
    rect.addEventListener('click', function () {
      var title = rect.querySelector('title');
      inspector.textContent = title ? title.textContent : rect.getAttribute('data-address');
    });
  });
  document.getElementById('state-filter').addEventListener('change', function (e) {
    var want = e.target.value;
    blocks.forEach(function (rect) {
      var show = want === 'all' || rect.getAttribute('data-state') === want;
      rect.classList.toggle('dim', !show);
    });
  });
})();
</script>
)";

}  // namespace

std::string RenderHtml(const MemorySnapshot& snapshot, absl::string_view title) {
  std::string svg = RenderSvg(snapshot, title);
  if (svg.rfind("<?xml", 0) == 0) svg.erase(0, svg.find('\n') + 1);  // not allowed inside HTML
  std::string out;
  out.reserve(svg.size() + 8192);
  absl::StrAppend(&out, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>",
                  EscapeHtml(title), "</title>\n", kStyle, "</head>\n<body>\n<h1>", EscapeHtml(title),
                  "</h1>\n");
  absl::StrAppend(
      &out,
      "<div id=\"controls\">Show blocks: <select id=\"state-filter\"><option value=\"all\">all</option>"
      "<option value=\"allocated\">allocated</option><option value=\"pending_free\">pending free</option>"
      "<option value=\"free\">free</option></select> &nbsp; Click a block to inspect it; hover for a "
      "tooltip.</div>\n<div id=\"inspector\">(no block selected)</div>\n");
  absl::StrAppend(&out, svg);
  absl::StrAppend(&out, "<details open><summary>Summary</summary><pre>",
                  EscapeHtml(RenderSummaryText(snapshot, title)), "</pre></details>\n");
  absl::StrAppend(&out, kScript, "</body>\n</html>\n");
  return out;
}

}  // namespace graphalloc::tools
