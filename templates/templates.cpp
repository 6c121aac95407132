#include "kdajit/templates.hpp"

namespace kdajit {

std::string_view template_text(std::string_view name) {
  for (const auto& f : template_files())
    if (f.name == name) return f.text;
  return {};
}

}  // namespace kdajit
