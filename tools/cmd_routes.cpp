// `kdajit routes [--json]`: the route table (generator/src/route_table.cpp) as
// the selector, the generator and the launcher read it.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "kdajit/routes.hpp"

namespace kdajit::cli {

void add_routes_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("routes",
                                 "Print the route table: route, ops, threads, cluster, CTAs per SM, eligibility, "
                                 "shared-memory stages");
  auto json_out = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json_out, "print a JSON array instead of a table");
  cmd->callback([json_out] {
    nlohmann::json arr = nlohmann::json::array();
    for (const RouteSpec& r : route_table()) {
      nlohmann::json ops = nlohmann::json::array(), templates = nlohmann::json::object(),
                     threads = nlohmann::json::object(), ctas = nlohmann::json::object(),
                     smem = nlohmann::json::object();
      for (Op op : all_values<Op>()) {
        if (!r.serves(op)) continue;
        ops.push_back(to_string(op));
        templates[std::string(to_string(op))] = r.template_file(op);
        // Threads and CTAs per SM may depend on the state dtype (rowcta packed
        // bf16: 512 threads; split2 packed f32: one CTA per SM).
        for (StateDtype st : all_values<StateDtype>()) {
          KernelKey k;
          k.op = op;
          k.tokens = op == Op::single ? 1 : chunked(op) ? route_chunk(r.route) : 2;
          k.state = st;
          k.route = r.route;
          const std::string family = fmt::format("{}.{}", to_string(op), to_string(st));
          threads[family] = r.threads(k);
          ctas[family] = r.ctas_per_sm(k);
          // Shared-memory state stages (route stream), and the chunked ops'
          // chunk buffers: dynamic shared memory per CTA.
          if (r.stage_count(k) > 0 || chunked(op))
            smem[family] = {{"stages", r.stage_count(k)}, {"bytes", r.dynamic_smem_bytes(k)}};
        }
      }
      arr.push_back({{"name", r.name()},
                     {"ops", ops},
                     {"templates", templates},
                     {"threads", threads},
                     {"cluster", r.cluster},
                     {"ctas_per_sm", ctas},
                     {"dynamic_smem", smem},
                     {"entry",
                      {{"single", entry_name(Op::single)},
                       {"packed", entry_name(Op::packed)},
                       {"prefill", entry_name(Op::prefill)},
                       {"chunk", entry_name(Op::chunk)}}},
                     {"eligibility", r.eligibility},
                     {"technique", r.technique}});
      // A route that launches a kernel before its own (twopass): that kernel's name per op.
      if (r.pre_grid != nullptr) {
        arr.back()["pre_entry"] = {{"prefill", pre_entry_name(Op::prefill)}, {"chunk", pre_entry_name(Op::chunk)}};
        KernelKey k;
        k.op = Op::prefill;
        k.tokens = kPrefillChunk;
        k.route = r.route;
        arr.back()["pre_dynamic_smem_bytes"] = r.pre_dynamic_smem_bytes(k);
        arr.back()["pre_ctas_per_sm"] = kTwopassIntraCtasPerSm;
      }
      // And one after its own (twopass, prefill op: the norm kernel).
      if (r.post_grid != nullptr) arr.back()["post_entry"] = {{"prefill", post_entry_name(Op::prefill)}};
    }
    if (*json_out) {
      fmt::print("{}\n", arr.dump(2));
      return;
    }
    fmt::print("{:<11} {:<28} {:<88} {:>7}  {}\n", "route", "ops", "threads", "cluster", "eligible when");
    // "single.f32=256 single.bf16=256 ..." of a {op.state: int} object.
    const auto per_family = [](const nlohmann::json& by) {
      std::vector<std::string> out;
      for (auto it = by.begin(); it != by.end(); ++it) out.push_back(fmt::format("{}={}", it.key(), it.value().get<int>()));
      return fmt::format("{}", fmt::join(out, " "));
    };
    for (const auto& r : arr) {
      const std::vector<std::string> ops = r["ops"].get<std::vector<std::string>>();
      fmt::print("{:<11} {:<28} {:<88} {:>7}  {}\n", r["name"].get<std::string>(), fmt::format("{}", fmt::join(ops, ",")),
                 per_family(r["threads"]), r["cluster"].get<int>(), r["eligibility"].get<std::string>());
      fmt::print("{:<11} {}\n", "", r["technique"].get<std::string>());
      fmt::print("{:<11} CTAs per SM: {}\n", "", per_family(r["ctas_per_sm"]));
      std::vector<std::string> stages, chunk;
      for (auto it = r["dynamic_smem"].begin(); it != r["dynamic_smem"].end(); ++it) {
        if (it.value()["stages"].get<int>() > 0)
          stages.push_back(fmt::format("{}={} ({} KiB)", it.key(), it.value()["stages"].get<int>(),
                                       it.value()["bytes"].get<uint32_t>() / 1024));
        else
          chunk.push_back(fmt::format("{}={} KiB", it.key(), it.value()["bytes"].get<uint32_t>() / 1024));
      }
      if (!stages.empty())
        fmt::print("{:<11} shared-memory state stages: {}\n", "", fmt::format("{}", fmt::join(stages, " ")));
      if (!chunk.empty())
        fmt::print("{:<11} chunk buffers (dynamic shared memory): {}\n", "", fmt::format("{}", fmt::join(chunk, " ")));
      if (r.contains("pre_dynamic_smem_bytes"))
        fmt::print("{:<11} first kernel ({}): {} KiB of dynamic shared memory, {} CTAs per SM\n", "",
                   r["pre_entry"]["prefill"].get<std::string>(), r["pre_dynamic_smem_bytes"].get<uint32_t>() / 1024,
                   r["pre_ctas_per_sm"].get<int>());
    }
  });
}

}  // namespace kdajit::cli
