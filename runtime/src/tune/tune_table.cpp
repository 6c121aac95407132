#include "kdajit/runtime/tune/tune_table.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kdajit {

namespace {

constexpr int kTuneSchema = 1;
constexpr size_t kMaxTableBytes = 16u << 20;

std::string file_safe(std::string_view s) {
  std::string out;
  for (char c : s) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '_';
  return out.empty() ? "gpu" : out;
}

nlohmann::json identity_json(const TuneIdentity& id) {
  return {{"gpu_name", id.gpu_name},         {"sm_count", id.sm_count},
          {"driver_version", id.driver_version}, {"nvrtc_version", id.nvrtc_version},
          {"kdajit_version", id.kdajit_version}, {"arch", to_string(id.arch)}};
}

Error io_error(std::string_view what, const std::string& path) {
  return Error(ErrorCode::io, fmt::format("tune table {}: {} failed: {}", path, what, std::strerror(errno)));
}

// mkdir -p with mode 0700, refusing to walk through a symbolic link.
Status make_private_dirs(const std::string& dir) {
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    cur = dir.substr(0, pos);
    if (cur.empty()) continue;
    struct stat st {};
    if (::lstat(cur.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode))
        return Error(ErrorCode::io, fmt::format("tune table: {} is not a directory (or is a symbolic link)", cur));
      continue;
    }
    if (::mkdir(cur.c_str(), 0700) != 0 && errno != EEXIST) return io_error("mkdir", cur);
  }
  return {};
}

}  // namespace

KernelKey TuneTable::family_of(const KernelKey& k) {
  KernelKey f = k;
  f.route = Route::rowcta;
  f.arch = Arch::sm_90;
  return f;
}

void TuneTable::add(const KernelKey& family, Band band) {
  auto& v = bands_[family_of(family)];
  v.push_back(band);
  std::sort(v.begin(), v.end(), [](const Band& a, const Band& b) { return a.rows_lo < b.rows_lo; });
}

std::optional<Route> TuneTable::route_for(const CallShape& call) const {
  if (chunked(call.family.op)) return std::nullopt;  // tables hold decode families only
  auto it = bands_.find(family_of(call.family));
  if (it == bands_.end()) return std::nullopt;
  const int64_t rows = call.family.op == Op::packed ? call.num_seqs : call.rows;
  std::optional<Route> out;
  for (const Band& b : it->second) {
    if (b.rows_lo > rows) break;
    out = b.route;
  }
  if (!out) out = it->second.front().route;  // below the first band: the smallest measured
  return out;
}

nlohmann::json TuneTable::to_json() const {
  nlohmann::json fams = nlohmann::json::array();
  // Sorted for a stable file.
  std::vector<KernelKey> keys;
  for (const auto& [k, v] : bands_) keys.push_back(k);
  std::sort(keys.begin(), keys.end());
  for (const auto& k : keys) {
    nlohmann::json fam = key_to_json(k);
    fam.erase("route");
    fam.erase("arch");
    nlohmann::json bands = nlohmann::json::array();
    for (const Band& b : bands_.at(k)) bands.push_back({{"rows_lo", b.rows_lo}, {"route", to_string(b.route)}, {"us", b.us}});
    fams.push_back({{"family", fam}, {"bands", bands}});
  }
  return {{"schema", kTuneSchema}, {"identity", identity_json(identity_)}, {"families", fams}};
}

Result<TuneTable> TuneTable::from_json(const nlohmann::json& j) {
  auto bad = [](std::string what) { return Error(ErrorCode::cache, "tune table: " + what); };
  if (!j.is_object() || !j.contains("schema") || j["schema"] != kTuneSchema) return bad("unknown schema");
  const auto& id = j.value("identity", nlohmann::json::object());
  TuneIdentity ident;
  try {
    ident.gpu_name = id.at("gpu_name").get<std::string>();
    ident.sm_count = id.at("sm_count").get<int>();
    ident.driver_version = id.at("driver_version").get<int>();
    ident.nvrtc_version = id.at("nvrtc_version").get<std::string>();
    ident.kdajit_version = id.at("kdajit_version").get<std::string>();
    KDAJIT_TRY_ASSIGN(ident.arch, parse_arch(id.at("arch").get<std::string>()));
  } catch (const nlohmann::json::exception& e) {
    return bad(fmt::format("identity: {}", e.what()));
  }
  TuneTable t(ident);
  if (!j.contains("families") || !j["families"].is_array()) return bad("expected an array 'families'");
  for (const auto& fam : j["families"]) {
    if (!fam.is_object() || !fam.contains("family") || !fam.contains("bands") || !fam["bands"].is_array())
      return bad("expected families of {family, bands}");
    nlohmann::json kj = fam["family"];
    if (!kj.is_object()) return bad("family: expected an object");
    kj["route"] = "rowcta";
    kj["arch"] = to_string(ident.arch);
    auto key = key_from_json(kj);
    if (!key) return bad(key.error().message);
    if (chunked(key->op)) return bad(fmt::format("family: op {} is not tuned (expected single or packed)", to_string(key->op)));
    for (const auto& b : fam["bands"]) {
      if (!b.is_object() || !b.contains("rows_lo") || !b["rows_lo"].is_number_integer() || !b.contains("route") ||
          !b["route"].is_string())
        return bad("bands: expected {rows_lo, route}");
      auto route = parse_field<Route>(b["route"].get<std::string>());
      if (!route) return bad(route.error().message);
      if (!route_spec(*route).serves(key->op)) return bad(fmt::format("route {} does not serve {}", to_string(*route), to_string(key->op)));
      t.add(*key, Band{std::max<int64_t>(1, b["rows_lo"].get<int64_t>()), *route, b.value("us", 0.0)});
    }
  }
  return t;
}

std::string TuneTable::path_for(const std::string& cache_root, const TuneIdentity& id) {
  return fmt::format("{}/tune/{}/{}.sm{}.json", cache_root, to_string(id.arch), file_safe(id.gpu_name), id.sm_count);
}

bool TuneTable::present(const std::string& cache_root, const TuneIdentity& id) {
  struct stat st {};
  return !cache_root.empty() && ::lstat(path_for(cache_root, id).c_str(), &st) == 0;
}

Result<std::optional<TuneTable>> TuneTable::load(const std::string& cache_root, const TuneIdentity& id) {
  if (cache_root.empty()) return std::optional<TuneTable>{};
  const std::string path = path_for(cache_root, id);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return std::optional<TuneTable>{};
    return io_error("open", path);
  }
  struct stat st {};
  std::string text;
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  const bool trusted = regular && (st.st_uid == ::geteuid() || st.st_uid == 0) && !(st.st_mode & S_IWOTH);
  if (regular && trusted && static_cast<size_t>(st.st_size) <= kMaxTableBytes) {
    text.resize(static_cast<size_t>(st.st_size));
    size_t off = 0;
    while (off < text.size()) {
      const ssize_t n = ::read(fd, text.data() + off, text.size() - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    text.resize(off);
  }
  ::close(fd);
  if (!regular) return Error(ErrorCode::cache, fmt::format("tune table {}: not a regular file", path));
  if (!trusted)
    return Error(ErrorCode::cache, fmt::format("tune table {}: owned by another user or writable by others", path));
  if (static_cast<size_t>(st.st_size) > kMaxTableBytes)
    return Error(ErrorCode::cache, fmt::format("tune table {}: larger than {} bytes", path, kMaxTableBytes));
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Error(ErrorCode::cache, fmt::format("tune table {}: not valid JSON", path));
  KDAJIT_TRY_ASSIGN(TuneTable t, from_json(j));
  if (!(t.identity() == id))
    return Error(ErrorCode::cache,
                 fmt::format("tune table {} was measured with {} and does not match this process ({}); re-run "
                             "`kdajit tune`",
                             path, identity_json(t.identity()).dump(), identity_json(id).dump()));
  return std::optional<TuneTable>(std::move(t));
}

Status TuneTable::save(const std::string& cache_root) const {
  if (cache_root.empty()) return Error(ErrorCode::io, "tune table: no cache root to write into");
  const std::string path = path_for(cache_root, identity_);
  const std::string dir = path.substr(0, path.rfind('/'));
  KDAJIT_TRY(make_private_dirs(dir));
  std::random_device rd;
  const std::string tmp = fmt::format("{}/.tune.{:08x}{:08x}.tmp", dir, rd(), rd());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return io_error("create", tmp);
  const std::string text = to_json().dump(2) + "\n";
  size_t off = 0;
  bool ok = true;
  while (ok && off < text.size()) {
    const ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    ok = n > 0;
    if (ok) off += static_cast<size_t>(n);
  }
  ok = ok && ::fsync(fd) == 0;
  ::close(fd);
  // rename() replaces a link at `path` itself rather than writing through it.
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    Error e = io_error(ok ? "rename" : "write", path);
    ::unlink(tmp.c_str());
    return e;
  }
  return {};
}

}  // namespace kdajit
