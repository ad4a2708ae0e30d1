// The streaming pipeline's buffer ring (apps/pipeline.*) with stand-in stages: every chunk of
// this rank's share of the grid is read, computed and written once, in order, from the buffer it
// was read into; the reader never runs more than input_buffers() chunks ahead of the compute;
// `prepare` runs once, before the first compute, while the reader already reads, and `setup`
// before it on the calling thread; a failing stage stops the others and its error comes out. With pin_device 0 on a machine without a GPU the
// buffers stay ordinary memory (registration is refused) and everything else is the same.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "hk/build_config.hpp"
#include "hk/error.hpp"
#include "host_buffers.hpp"
#include "pipeline.hpp"

namespace {

struct Record {
  std::mutex m;
  std::vector<int64_t> read, computed, written;
  int64_t max_ahead = 0;  // chunks read but not yet computed, at most
  bool prepared = false, read_before_prepare_returned = false;
};

void run_grid(int64_t B, int64_t chunk, int rank, int ranks, int pin_device) {
  SCOPED_TRACE("B=" + std::to_string(B) + " chunk=" + std::to_string(chunk) + " rank " + std::to_string(rank) + "/" +
               std::to_string(ranks) + " pin_device " + std::to_string(pin_device));
  const int S = 3, D = 5;
  const hk::app::ChunkGrid g{B, chunk, rank, ranks};
  Record r;
  std::vector<float> out(size_t(B * S * D), -1.0f);
  hk::app::PipelineStages st;
  // The compute stage is not ready until the reader has filled every input buffer it has (or read
  // every chunk there is): the reader must work ahead of it, and no further than its buffers.
  const int64_t fill = std::min<int64_t>(hk::app::input_buffers(pin_device >= 0), g.local_chunks());
  st.prepare = [&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(r.m);
        if (int64_t(r.read.size()) >= fill || std::chrono::steady_clock::now() > until) {
          r.read_before_prepare_returned = int64_t(r.read.size()) >= fill;
          r.prepared = true;
          return;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  st.read = [&](int64_t b0, int64_t nb, float* x, int32_t* lengths) {
    for (int64_t i = 0; i < nb * S * D; ++i) x[i] = float(b0 * S * D + i);
    for (int64_t b = 0; b < nb; ++b) lengths[b] = int32_t((b0 + b) % (S + 1));
    std::lock_guard<std::mutex> lock(r.m);
    r.read.push_back(b0);
    r.max_ahead = std::max<int64_t>(r.max_ahead, int64_t(r.read.size() - r.computed.size()));
  };
  st.compute = [&](int64_t b0, int64_t nb, const float* x, const int32_t* lengths, float* y) {
    {
      std::lock_guard<std::mutex> lock(r.m);
      EXPECT_TRUE(r.prepared) << "compute before prepare";
      r.computed.push_back(b0);
    }
    for (int64_t b = 0; b < nb; ++b) EXPECT_EQ(lengths[b], int32_t((b0 + b) % (S + 1))) << "lengths of row " << b0 + b;
    for (int64_t i = 0; i < nb * S * D; ++i) y[i] = x[i] + 0.5f;
  };
  st.write = [&](int64_t b0, int64_t nb, const float* y, const int32_t* lengths) {
    if (nb == 0) return;
    // The chunk's own lengths reach the writer (its input buffer may hold a later chunk by now).
    for (int64_t b = 0; b < nb; ++b)
      EXPECT_EQ(lengths[b], int32_t((b0 + b) % (S + 1))) << "lengths of row " << b0 + b << " at the writer";
    for (int64_t i = 0; i < nb * S * D; ++i) out[size_t(b0 * S * D + i)] = y[i];
    std::lock_guard<std::mutex> lock(r.m);
    r.written.push_back(b0);
  };
  const hk::app::PipelineStats stats = hk::app::run_pipeline(g, S, D, pin_device, st);

  std::vector<int64_t> mine;
  for (int64_t i = 0; i < g.local_chunks(); ++i) mine.push_back(g.first_row(g.global_index(i)));
  EXPECT_EQ(r.read, mine);
  EXPECT_EQ(r.computed, mine);
  EXPECT_EQ(r.written, mine);
  EXPECT_LE(r.max_ahead, hk::app::input_buffers(pin_device >= 0));
  if (g.local_chunks() > 0) {
    EXPECT_TRUE(r.read_before_prepare_returned) << "the reader did not fill its " << fill
                                                << " buffer(s) while the compute stage was not ready";
    EXPECT_EQ(r.max_ahead, fill);
    EXPECT_GT(stats.prepare_s, 0.0);
  }
  int64_t rows = 0;
  for (int64_t b = 0; b < B; ++b) {
    const bool own = (b / chunk) % ranks == rank;
    for (int64_t i = 0; i < S * D; ++i) {
      const size_t at = size_t(b * S * D + i);
      if (own) {
        ASSERT_EQ(out[at], float(at) + 0.5f) << "row " << b;
      } else {
        ASSERT_EQ(out[at], -1.0f) << "row " << b << " of another rank was written";
      }
    }
    rows += own;
  }
  EXPECT_EQ(stats.sequences_done, rows);
}

TEST(Pipeline, EveryChunkOnceInOrderWithinTheBufferRing) {
  for (const int pin_device : {-1, 0})
    for (const int64_t B : {1, 7, 23})
      for (const int64_t chunk : {1, 3, 7})
        for (const int ranks : {1, 3})
          for (int rank = 0; rank < ranks; ++rank) run_grid(B, chunk, rank, ranks, pin_device);
}

TEST(Pipeline, AFailingStageStopsTheRunWithItsError) {
  const hk::app::ChunkGrid g{40, 2, 0, 1};
  for (const char* failing : {"read", "compute", "write", "prepare"}) {
    std::atomic<int> calls{0};
    hk::app::PipelineStages st;
    const std::string f = failing;
    st.prepare = [&] {
      if (f == "prepare") throw hk::Error("prepare failed");
    };
    st.read = [&](int64_t b0, int64_t, float*, int32_t*) {
      ++calls;
      if (f == "read" && b0 == 6) throw hk::Error("read failed");
    };
    st.compute = [&](int64_t b0, int64_t, const float*, const int32_t*, float*) {
      if (f == "compute" && b0 == 6) throw hk::Error("compute failed");
    };
    st.write = [&](int64_t b0, int64_t, const float*, const int32_t*) {
      if (f == "write" && b0 == 6) throw hk::Error("write failed");
    };
    try {
      hk::app::run_pipeline(g, 2, 2, 0, st);
      ADD_FAILURE() << failing << ": no error";
    } catch (const hk::Error& e) {
      EXPECT_EQ(std::string(e.what()), f + " failed");
    }
    EXPECT_LT(calls.load(), 20) << failing << ": the reader went on after the failure";
  }
}

// `setup` runs on the calling thread while the reader already fills the input buffers, before
// the writer, `prepare` and the compute stage; its answer (the device to page-lock for, here -1
// after buffers allocated for a GPU: a planned backend that turned out otherwise) is what counts.
TEST(Pipeline, SetupRunsBesideTheReaderBeforeEverythingElse) {
  if (std::getenv("HK_INPUT_BUFFERS")) GTEST_SKIP() << "HK_INPUT_BUFFERS is set: the buffer count is the default's here";
  const hk::app::ChunkGrid g{10, 2, 0, 1};
  std::mutex m;
  int64_t reads = 0, writes = 0;
  bool setup_done = false, prepared_after_setup = false, writes_before_setup = false, read_during_setup = false;
  const std::thread::id caller = std::this_thread::get_id();
  hk::app::PipelineStages st;
  st.setup = [&] {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(m);
        if (reads >= hk::app::input_buffers(true) || std::chrono::steady_clock::now() > until) {
          read_during_setup = reads >= hk::app::input_buffers(true);
          writes_before_setup = writes > 0;
          setup_done = true;
          return -1;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  st.prepare = [&] {
    std::lock_guard<std::mutex> lock(m);
    prepared_after_setup = setup_done;
  };
  st.read = [&](int64_t, int64_t nb, float* x, int32_t* lengths) {
    for (int64_t i = 0; i < nb * 2 * 2; ++i) x[i] = 1.0f;
    for (int64_t b = 0; b < nb; ++b) lengths[b] = 1;
    std::lock_guard<std::mutex> lock(m);
    ++reads;
  };
  st.compute = [&](int64_t, int64_t nb, const float* x, const int32_t*, float* y) {
    for (int64_t i = 0; i < nb * 2 * 2; ++i) y[i] = x[i];
  };
  st.write = [&](int64_t, int64_t nb, const float*, const int32_t*) {
    std::lock_guard<std::mutex> lock(m);
    writes += nb > 0;
  };
  const hk::app::PipelineStats stats = hk::app::run_pipeline(g, 2, 2, 0, st);
  EXPECT_TRUE(read_during_setup) << "the reader did not fill its buffers while the set-up ran";
  EXPECT_FALSE(writes_before_setup);
  EXPECT_TRUE(prepared_after_setup);
  EXPECT_EQ(reads, 5);
  EXPECT_EQ(writes, 5);
  EXPECT_EQ(stats.pin_tried, 0) << "page-locking was tried although the set-up said no device";
  EXPECT_EQ(stats.sequences_done, 10);
}

// A failing set-up's exception comes out as it is (any type: the caller's agreed failures are
// not std::exception), without `fatal`, once the reader has stopped; nothing is written.
TEST(Pipeline, AFailingSetupStopsTheReaderAndItsExceptionComesOut) {
  struct Agreed {
    int code;
  };
  const hk::app::ChunkGrid g{400, 2, 0, 1};
  std::atomic<int> reads{0}, writes{0}, fatals{0};
  hk::app::PipelineStages st;
  st.setup = [&]() -> int {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (reads.load() < 1 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    throw Agreed{7};
  };
  st.read = [&](int64_t, int64_t, float*, int32_t*) {
    ++reads;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  };
  st.compute = [&](int64_t, int64_t, const float*, const int32_t*, float*) {};
  st.write = [&](int64_t, int64_t, const float*, const int32_t*) { ++writes; };
  st.fatal = [&](const std::string&) { ++fatals; };
  try {
    hk::app::run_pipeline(g, 2, 2, -1, st);
    ADD_FAILURE() << "no exception";
  } catch (const Agreed& a) {
    EXPECT_EQ(a.code, 7);
  }
  EXPECT_GE(reads.load(), 1);
  EXPECT_EQ(writes.load(), 0);
  EXPECT_EQ(fatals.load(), 0);
}

// A reader that fails while the set-up runs: its error comes out once the set-up returns, without
// `prepare`, the compute stage or the writer starting; with `fatal` set, that is called once.
TEST(Pipeline, AReaderFailingDuringTheSetupEndsTheRunAfterIt) {
  for (const bool with_fatal : {false, true}) {
    SCOPED_TRACE(with_fatal ? "with fatal" : "without fatal");
    const hk::app::ChunkGrid g{40, 2, 0, 1};
    std::atomic<int> reads{0}, writes{0}, fatals{0}, later{0};
    std::atomic<bool> setup_saw_failure{false};
    hk::app::PipelineStages st;
    st.setup = [&]() -> int {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (reads.load() < 1 && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the reader's throw lands meanwhile
      setup_saw_failure = reads.load() >= 1;
      return -1;
    };
    st.prepare = [&] { ++later; };
    st.read = [&](int64_t, int64_t, float*, int32_t*) {
      ++reads;
      throw hk::Error("read failed");
    };
    st.compute = [&](int64_t, int64_t, const float*, const int32_t*, float*) { ++later; };
    st.write = [&](int64_t, int64_t, const float*, const int32_t*) { ++writes; };
    if (with_fatal) st.fatal = [&](const std::string& what) {
      EXPECT_EQ(what, "read failed");
      ++fatals;
    };
    try {
      hk::app::run_pipeline(g, 2, 2, -1, st);
      ADD_FAILURE() << "no exception";
    } catch (const hk::Error& e) {
      EXPECT_EQ(std::string(e.what()), "read failed");
    }
    EXPECT_TRUE(setup_saw_failure.load());
    EXPECT_EQ(reads.load(), 1);
    EXPECT_EQ(later.load(), 0) << "prepare or compute ran after the reader had failed";
    EXPECT_EQ(writes.load(), 0);
    EXPECT_EQ(fatals.load(), with_fatal ? 1 : 0);
  }
}

// Chunk buffers of 2 MiB and more start on a 2 MiB boundary (transparent huge pages, marked
// MADV_HUGEPAGE), smaller ones on a page; HK_HOST_HUGEPAGES takes 1 or 0 (read once per process,
// so only its default is seen here) and the memory is usable either way.
TEST(HostBlock, LargeBlocksAreAlignedForHugePages) {
  if (std::getenv("HK_HOST_HUGEPAGES")) GTEST_SKIP() << "HK_HOST_HUGEPAGES is set: the default is what is tested";
  hk::app::HostBlock big(size_t(5) << 20, hk::app::HostBlock::Touch::now);
  hk::app::HostBlock small(size_t(12345), hk::app::HostBlock::Touch::later);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.as<char>()) % (size_t(2) << 20), 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.as<char>()) % 4096, 0u);
  big.as<char>()[(size_t(5) << 20) - 1] = 7;
  small.as<char>()[12344] = 7;
  EXPECT_EQ(big.as<char>()[0], 0) << "Touch::now zeroes the block";
  EXPECT_EQ(big.as<char>()[(size_t(5) << 20) - 1], 7);
}

}  // namespace

// The node's GPUs for the per-rank restriction (host_buffers.cpp): CUDA_VISIBLE_DEVICES entries
// as CUDA reads them, nothing when an entry would stop CUDA's parsing (the count would differ
// from CUDA's), and the restriction itself. A build without CUDA knows no GPUs.
TEST(NodeGpus, VisibleDevicesListsAndTheRestriction) {
  const char* before = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string saved = before ? before : "";
  auto gpus_for = [](const char* v) {
    ::setenv("CUDA_VISIBLE_DEVICES", v, 1);
    return hk::app::node_gpus();
  };
  using V = std::vector<std::string>;
  if (HK_HAVE_CUDA) {
    EXPECT_EQ(gpus_for("1,3"), (V{"1", "3"}));
    EXPECT_EQ(gpus_for("GPU-8f2c, 2"), (V{"GPU-8f2c", "2"}));
    EXPECT_EQ(gpus_for("MIG-1a2b"), (V{"MIG-1a2b"}));
    EXPECT_EQ(gpus_for("0,foo,2"), V{});
    EXPECT_EQ(gpus_for(""), V{});
    EXPECT_EQ(gpus_for("-1"), V{});
    EXPECT_TRUE(hk::app::restrict_to_gpu("3"));
    EXPECT_STREQ(std::getenv("CUDA_VISIBLE_DEVICES"), "3");
    EXPECT_FALSE(hk::app::restrict_to_gpu(""));
  } else {
    EXPECT_EQ(gpus_for("1,3"), V{});
    EXPECT_FALSE(hk::app::restrict_to_gpu("3"));
  }
  if (before) {
    ::setenv("CUDA_VISIBLE_DEVICES", saved.c_str(), 1);
  } else {
    ::unsetenv("CUDA_VISIBLE_DEVICES");
  }
}
