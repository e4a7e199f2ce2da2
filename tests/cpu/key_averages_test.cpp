// key_averages() and its table against numbers worked out by hand from the
// synthetic forward (synthetic_trace.h lists them).
#include "attnprof/key_averages.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "attnprof/error.h"
#include "synthetic_trace.h"

namespace attnprof {
namespace {

using testing::attention_trace;

const KeyAverage& row(const std::vector<KeyAverage>& rows, const std::string& name, bool on_device = false) {
  for (const KeyAverage& r : rows) {
    if (r.name == name && r.on_device == on_device) return r;
  }
  ADD_FAILURE() << "no row " << name;
  static const KeyAverage none;
  return none;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// The data rows of a table: between the second and the last separator line.
std::vector<std::string> data_rows(const std::string& table) {
  const auto all = lines(table);
  std::vector<std::size_t> seps;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (!all[i].empty() && all[i].find_first_not_of("- ") == std::string::npos) seps.push_back(i);
  }
  EXPECT_EQ(seps.size(), 3u) << table;
  if (seps.size() != 3) return {};
  return {all.begin() + static_cast<long>(seps[1]) + 1, all.begin() + static_cast<long>(seps[2])};
}

// The first cell of a row: the right-aligned name.
std::string name_of(const std::string& line) {
  const auto first = line.find_first_not_of(' ');
  return line.substr(first, line.find("  ", first) - first);
}

TEST(KeyAverages, SelfCpuIsTotalMinusDirectChildren) {
  const auto rows = key_averages(attention_trace());
  EXPECT_EQ(row(rows, "forward").cpu_total_ns, 800'000);
  EXPECT_EQ(row(rows, "forward").self_cpu_ns, 150'000);
  EXPECT_EQ(row(rows, "ProfilerStep*").self_cpu_ns, 100'000);
  EXPECT_EQ(row(rows, "masked_fill").self_cpu_ns, 110'000);  // minus copy_ and its launch
  EXPECT_EQ(row(rows, "copy_").self_cpu_ns, 60'000);
  EXPECT_EQ(row(rows, "matmul").self_cpu_ns, 270'000);
  EXPECT_EQ(row(rows, "matmul").cpu_total_ns, 300'000);
  EXPECT_EQ(row(rows, "cudaLaunchKernel").self_cpu_ns, 40'000);
  std::int64_t self_sum = 0;
  for (const KeyAverage& r : rows) self_sum += r.self_cpu_ns;
  EXPECT_EQ(self_sum, 900'000);  // the step's whole span, counted once
}

TEST(KeyAverages, CountsAndStepRows) {
  const auto rows = key_averages(attention_trace());
  EXPECT_EQ(row(rows, "matmul").count, 2);
  EXPECT_EQ(row(rows, "cudaLaunchKernel").count, 4);
  EXPECT_EQ(row(rows, "cuLaunchKernelEx").count, 1);
  EXPECT_EQ(row(rows, "ProfilerStep*").count, 1);
  EXPECT_EQ(row(rows, "ProfilerStep*").type, ActivityType::UserAnnotation);
  EXPECT_EQ(row(rows, "ampere_bf16_s16816gemm_bf16_128x64", true).count, 2);
  // Rows come in order of first appearance.
  EXPECT_EQ(rows.front().name, "ProfilerStep*");
  EXPECT_EQ(rows[1].name, "forward");
}

TEST(KeyAverages, CudaTimeGoesToTheLaunchingOp) {
  const auto rows = key_averages(attention_trace());
  // Both GEMMs, the second launched through cuLaunchKernelEx.
  EXPECT_EQ(row(rows, "matmul").self_cuda_ns, 60'000);
  EXPECT_EQ(row(rows, "matmul").cuda_total_ns, 60'000);
  EXPECT_EQ(row(rows, "mul").self_cuda_ns, 20'000);
  // The copy is masked_fill's through copy_, so only its total holds it.
  EXPECT_EQ(row(rows, "masked_fill").self_cuda_ns, 15'000);
  EXPECT_EQ(row(rows, "masked_fill").cuda_total_ns, 55'000);
  EXPECT_EQ(row(rows, "copy_").self_cuda_ns, 40'000);
  EXPECT_EQ(row(rows, "softmax").cuda_total_ns, 25'000);
  EXPECT_EQ(row(rows, "forward").self_cuda_ns, 0);
  EXPECT_EQ(row(rows, "forward").cuda_total_ns, 160'000);
  EXPECT_EQ(row(rows, "ProfilerStep*").cuda_total_ns, 160'000);
  // Launch calls are CPU time only, as in PyTorch.
  EXPECT_EQ(row(rows, "cudaLaunchKernel").cuda_total_ns, 0);
  EXPECT_EQ(row(rows, "cuLaunchKernelEx").cuda_total_ns, 0);
}

TEST(KeyAverages, DeviceRowsCarryTheirOwnTime) {
  const auto rows = key_averages(attention_trace());
  const KeyAverage& gemm = row(rows, "ampere_bf16_s16816gemm_bf16_128x64", true);
  EXPECT_TRUE(gemm.on_device);
  EXPECT_EQ(gemm.type, ActivityType::Kernel);
  EXPECT_EQ(gemm.self_cuda_ns, 60'000);
  EXPECT_EQ(gemm.cuda_total_ns, 60'000);
  EXPECT_EQ(gemm.self_cpu_ns, 0);
  EXPECT_EQ(gemm.cpu_total_ns, 0);
  EXPECT_DOUBLE_EQ(gemm.cuda_avg_ns(), 30'000.0);
  const KeyAverage& copy = row(rows, "Memcpy DtoD (Device -> Device)", true);
  EXPECT_EQ(copy.type, ActivityType::Memcpy);
  EXPECT_EQ(copy.self_cuda_ns, 40'000);
}

TEST(KeyAverages, NestingIsPerThreadAndDepthBreaksTies) {
  Trace t;
  Activity outer = testing::host(ActivityType::CpuOp, "outer", 0, 100, 0);
  Activity inner = testing::host(ActivityType::CpuOp, "inner", 0, 100, 1);  // the same span, one deeper
  Activity other = testing::host(ActivityType::CpuOp, "other_thread", 10, 50, 1);
  other.tid = testing::kTid + 1;
  t.activities = {outer, inner, other};
  const auto rows = key_averages(t);
  EXPECT_EQ(row(rows, "outer").self_cpu_ns, 0);
  EXPECT_EQ(row(rows, "inner").self_cpu_ns, 100);
  EXPECT_EQ(row(rows, "other_thread").self_cpu_ns, 50);
}

TEST(KeyAverages, ExternalIdLinksALaunchFromAnUnmappedThread) {
  Trace t;
  Activity op = testing::host(ActivityType::CpuOp, "matmul", 0, 100'000, 0);
  op.external_id = 7;
  Activity launch = testing::host(ActivityType::CudaDriver, "cuLaunchKernelEx", 10'000, 5'000, 0, 42);
  launch.tid = 999;  // the collector's raw thread id
  launch.external_id = 7;
  t.activities = {op, launch, testing::device(ActivityType::Kernel, "cudnn_sdpa", 20'000, 30'000, 42)};
  const auto rows = key_averages(t);
  EXPECT_EQ(row(rows, "matmul").self_cuda_ns, 30'000);
  EXPECT_EQ(row(rows, "matmul").cuda_total_ns, 30'000);
  EXPECT_EQ(row(rows, "matmul").self_cpu_ns, 100'000);  // a launch on another thread is no child
}

TEST(KeyAveragesTable, LayoutAndTotals) {
  const std::string table = key_averages_table(attention_trace());
  const auto all = lines(table);
  ASSERT_GE(all.size(), 6u);
  for (const char* header : {"Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg", "Self CUDA",
                             "Self CUDA %", "CUDA total", "CUDA time avg", "# of Calls"}) {
    EXPECT_NE(all[1].find(header), std::string::npos) << header;
  }
  EXPECT_LT(all[1].find("CPU time avg"), all[1].find("Self CUDA"));
  EXPECT_EQ(all[0], all[2]);
  EXPECT_EQ(all[all.size() - 2], "Self CPU time total: 900.000us");
  EXPECT_EQ(all.back(), "Self CUDA time total: 160.000us");
  EXPECT_EQ(data_rows(table).size(), key_averages(attention_trace()).size());

  // forward: 150 us self of 900, 800 us total, 160 us device time under it.
  for (const std::string& l : data_rows(table)) {
    if (name_of(l) != "forward") continue;
    EXPECT_NE(l.find("16.67%"), std::string::npos) << l;
    EXPECT_NE(l.find("150.000us"), std::string::npos) << l;
    EXPECT_NE(l.find("88.89%"), std::string::npos) << l;
    EXPECT_NE(l.find("160.000us"), std::string::npos) << l;
  }
}

TEST(KeyAveragesTable, SortKeysAndRowLimit) {
  const Trace t = attention_trace();
  EXPECT_EQ(name_of(data_rows(key_averages_table(t))[0]), "ProfilerStep*");
  EXPECT_EQ(name_of(data_rows(key_averages_table(t, {.sort_by = "self_cpu_time_total"}))[0]), "matmul");
  EXPECT_EQ(name_of(data_rows(key_averages_table(t, {.sort_by = "count"}))[0]), "cudaLaunchKernel");
  const auto by_self_cuda = data_rows(key_averages_table(t, {.sort_by = "self_cuda_time_total"}));
  EXPECT_EQ(name_of(by_self_cuda[0]), "matmul");  // ties with the GEMM row; first seen wins
  EXPECT_EQ(name_of(by_self_cuda[1]), "ampere_bf16_s16816gemm_bf16_128x64");
  const auto by_cuda = data_rows(key_averages_table(t, {.sort_by = "cuda_time_total", .row_limit = 3}));
  ASSERT_EQ(by_cuda.size(), 3u);
  EXPECT_EQ(name_of(by_cuda[0]), "ProfilerStep*");
  EXPECT_EQ(name_of(by_cuda[1]), "forward");
  EXPECT_EQ(name_of(by_cuda[2]), "matmul");
  // The totals still cover every row.
  EXPECT_NE(key_averages_table(t, {.row_limit = 1}).find("Self CPU time total: 900.000us"), std::string::npos);
}

TEST(KeyAveragesTable, UnknownSortKeyNamesTheChoices) {
  try {
    key_averages_table(attention_trace(), {.sort_by = "bogus"});
    FAIL() << "expected Error(InvalidArgument)";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("unknown sort_by 'bogus'"), std::string::npos) << msg;
    EXPECT_EQ(e.fields(), std::vector<std::string>{"sort_by"});
    EXPECT_NE(msg.find("self_cuda_time_total"), std::string::npos) << msg;
  }
  EXPECT_THROW(key_averages_table(Trace{}, {.sort_by = "bogus"}), Error);
}

TEST(KeyAveragesTable, NoCudaColumnsWithoutDeviceActivities) {
  Trace t;
  t.activities.push_back(testing::host(ActivityType::CpuOp, "softmax", 0, 2'500'000, 0));
  t.activities.push_back(testing::host(ActivityType::CpuOp, "bmm", 2'500'000, 1'200'000'000, 0));
  const std::string table = key_averages_table(t);
  EXPECT_EQ(table.find("CUDA"), std::string::npos) << table;
  EXPECT_NE(table.find("2.500ms"), std::string::npos);
  EXPECT_NE(table.find("1.200s"), std::string::npos);
  EXPECT_EQ(lines(table).back(), "Self CPU time total: 1.202s");
  EXPECT_EQ(key_averages_table(Trace{}), "");
}

TEST(KeyAveragesTable, LongNamesAreCut) {
  Trace t;
  t.activities.push_back(testing::host(ActivityType::CpuOp, std::string(80, 'k'), 0, 1'000, 0));
  const auto rows = data_rows(key_averages_table(t));
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(name_of(rows[0]), std::string(52, 'k') + "...");
}

TEST(FormatTime, AsPyTorchPrintsIt) {
  EXPECT_EQ(format_time_us(56.0), "56.000us");
  EXPECT_EQ(format_time_us(1234.0), "1.234ms");
  EXPECT_EQ(format_time_us(1'200'000.0), "1.200s");
  EXPECT_EQ(format_time_us(0.0), "0.000us");
}

}  // namespace
}  // namespace attnprof
