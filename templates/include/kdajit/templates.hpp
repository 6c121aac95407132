// The kernel source templates, embedded into the library at build time
// (cmake/embed_templates.cmake), so an installed kdajit needs no files on disk.
#pragma once

#include <string_view>
#include <vector>

namespace kdajit {

struct TemplateFile {
  std::string_view name;  // file name in templates/, e.g. "kda_single.cu"
  std::string_view text;
};

const std::vector<TemplateFile>& template_files();

// The text of one embedded template file; empty if there is none of that name.
std::string_view template_text(std::string_view name);

}  // namespace kdajit
