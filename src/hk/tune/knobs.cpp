#include "hk/tune/knobs.hpp"

#include <cstdlib>

#include "hk/error.hpp"

namespace hk::tune {

const std::vector<Knob>& knobs() {
  static const std::vector<Knob> table = {
      {"HK_TUNE", "1|0", "1", "tuning",
       "Measured dispatch: each route decision times its candidates on the caller's buffers during the first "
       "forward of a batch size and keeps the fastest (cached on disk). 0 pins every decision to its default "
       "route, times nothing and touches no cache (the untuned engine)."},
      {"HK_TUNE_CACHE", "DIR|off", "$XDG_CACHE_HOME/hk, else ~/.cache/hk", "tuning",
       "Directory of the tune cache file (tune-v1.json). Entries are keyed by op, shape, dtype, device identity, "
       "library versions and a fingerprint of the kernel sources and build. off: no disk cache."},
      {"HK_TUNE_REMEASURE", "0|1", "0", "tuning",
       "1: ignore cached decisions, measure again and overwrite them."},
      {"HK_TUNE_VERBOSE", "0|1", "0", "tuning",
       "1: one line per decision on stderr (candidates, times, winner, where the answer came from). Rejections "
       "by the numeric guard are always reported."},
      {"HK_ATTENTION", "auto|flash|flash.q64|flash.q16|flash.k2|flash.k4|flash.g4|cudnn|materialized", "auto", "cuda",
       "Attention route. auto: measured (untuned: the own flash kernel, query tile chosen by occupancy). "
       "flash.k2 / flash.k4: keys split over a cluster of 2 / 4 CTAs (f16, head_dim 16-64, sm_90+). "
       "flash.g4: 4 heads per CTA (f16, head_dim 8, H a multiple of 4). "
       "materialized: scores in memory (cuBLASLt batched GEMMs + a softmax kernel), a candidate only while "
       "the fp32 scores take at most 128 MiB. A pinned route the shape does not support falls back to flash "
       "(explain says why)."},
      {"HK_GELU", "auto|erf|epilogue", "auto", "cuda",
       "ffn_in's bias+GELU. erf: cuBLASLt bias epilogue then an exact-erf pass (the untuned default); epilogue: "
       "cuBLASLt's tanh-approximation GELU epilogue (fast precision only). auto: measured, the tanh route "
       "(and the fused post-attention chain's tanh-form GELU) only where the numeric guard accepts it; erf "
       "excludes both."},
      {"HK_GEMM_LAYOUT", "auto|nk|kn", "auto", "cuda",
       "Weight layout of every GEMM: nk = nn.Linear's [N, K] (the untuned default), kn = a transposed [K, N] "
       "copy (more device memory). auto: measured per GEMM."},
      {"HK_GEMM_ALGO", "auto|0..7", "auto", "cuda",
       "cuBLASLt algorithm: the index into the heuristic's top candidates (0 = the heuristic's first, the "
       "untuned default). An index a GEMM lacks falls back to 0. auto: measured per GEMM."},
      {"HK_GEMM_NEIGHBOURS", "off|cluster|tiles", "off", "cuda",
       "When tuning, a second decision per cuBLASLt GEMM among the winner and configurations around the "
       "heuristic's candidates of its weight layout, each changed in one field: cluster: every other cluster "
       "shape; tiles: also every other tile id of the first three candidates and of the winner. A neighbour "
       "must be 2% faster. off: the heuristic's candidates only."},
      {"HK_QKV_GEMM", "auto|cublaslt|mma", "auto", "cuda",
       "QKV projection GEMM (fast precision, D a multiple of 32 up to 256): cublaslt = cuBLASLt (the untuned "
       "default), mma = the own mma.sync kernel launched with programmatic dependent launch (its tile width "
       "measured when tuning). auto: measured beside cuBLASLt's algorithms."},
      {"HK_CHAINS", "auto|off|persistent|post_attn_qkv|attention_chain|attention_model", "auto", "cuda",
       "Fused chain kernels (several steps in one kernel). off: single-step kernels only. auto: a chain is kept "
       "where it measures faster than the kernels it replaces (untuned: the table's first kernel), and the "
       "whole-model persistent kernels (D, F <= 128, S <= 128: a warp per row tile, or a CTA per sequence "
       "with the products split by columns) where one measures faster than the chosen per-layer plan, "
       "unless a step route is pinned (HK_ATTENTION, HK_GELU, HK_GEMM_LAYOUT, HK_GEMM_ALGO, HK_QKV_GEMM). "
       "persistent: the whole-model kernel (row tiles; columns where only that fits) wherever the model is "
       "within its limits. "
       "post_attn_qkv: the post-attention chain that also runs the next layer's QKV projection (fast precision, "
       "D = F = 64 or 128) wherever it applies, tuned or not. "
       "attention_chain: the post-attention chain with the layer's attention in front (and the next layer's "
       "QKV projection behind, the last layer ending at the final LayerNorm; fast precision, the dense layout, "
       "D = F = 128 with head_dim 32 or 64 with 16, S a multiple of 16 up to 128, compute capability 9.0+) "
       "wherever it applies, tuned or not. "
       "attention_model: the whole forward in one kernel, those attention chains layer after layer on the "
       "same thread-block clusters with the residual kept on chip (the same limits, 2 to 8 layers), tuned or "
       "not; tuned, it is a whole-model candidate beside the persistent kernels where a dense plan has at most "
       "16 row blocks per SM."},
      {"HK_LIBRARIES", "auto|all|own", "auto", "cuda",
       "Vendor libraries as routes (fast precision). all: cuBLASLt GEMMs (and cuDNN attention where tuning may "
       "pick it) are candidates or defaults as described above. own: hk's own kernels only (the mma QKV "
       "kernel, flash attention, the fused post-attention chain), so cuBLASLt is never loaded, where they "
       "cover the model (D a multiple of 32 up to 256, F a multiple of 8 up to 256, head_dim a multiple of 8) and no pin asks for a "
       "library route; else all. auto: own for a short job (the engine is told the job's size, as "
       "hk_forward does: at most 5e13 flops of forward work, e.g. 6e7 positions at D = F = 128), where "
       "cuBLASLt's one-time set-up (~0.15 s on an H200) would cost more than its faster GEMMs save; all "
       "otherwise. The two plans differ in bits; every rank of a job decides alike."},
      {"HK_GRAPH", "auto|1|0", "auto", "cuda",
       "CUDA graph replay of the whole forward. 1: always, 0: eager launches. auto: graph unless eager launch "
       "measures faster (best of three, 0.5% margin); untuned: graph."},
      {"HK_PACK", "auto|1|0", "auto", "cuda",
       "Padding-free execution when the valid token count is known (hk_forward, the host path): valid tokens "
       "packed by the first LayerNorm, GEMMs and row kernels on them, scattered back by the final LayerNorm. "
       "auto: when the packed rows (bucketed to B*S/32) are at most 85% of B*S and B*S >= 4096; 1: always; "
       "0: never (the dense plan)."},
      {"HK_PDL", "1|0", "1", "cuda",
       "Programmatic dependent launch of hk's own kernels on sm_90 and newer (also inside the forward's CUDA "
       "graph): a kernel stages its weights and launches while the previous kernel finishes, then waits for it "
       "before reading activations. 0: ordinary launches. The bits of the output are the same either way."},
      {"HK_GRAPH_MEMSET", "kernel|node", "kernel", "cuda",
       "How memset nodes in the forward's CUDA graph run (cuBLASLt puts a 4-byte memset in front of some GEMM "
       "kernels). kernel: each becomes a kernel node doing the same writes, with the same dependencies, so the "
       "GEMM after it follows a kernel (1.4-2.5% faster forwards where cuBLASLt adds memsets); node: left as "
       "captured. The bits of the output are the same either way."},
      {"HK_MPIIO_WRITE", "independent|posix|mmap|collective|individual", "independent", "io",
       "How the ranks of an MPI job write /output/y. independent: each rank writes its chunks (contiguous row "
       "ranges) through parallel HDF5 when they are ready, with no write rounds shared between ranks; posix: "
       "the same, with pwrite at the dataset's file offset past HDF5 and MPI-IO (coherent where the ranks share "
       "one page cache, i.e. one node, or on a POSIX-coherent parallel file system such as Lustre or GPFS; not "
       "on NFS; measured slower than independent with 2 ranks on one node); mmap: as posix, each rank copying "
       "into a shared mapping of its byte ranges (reserved with fallocate first) instead of calling pwrite, so "
       "that the ranks' copies into one file do not queue on its inode lock; collective: collective MPI-IO "
       "(two-phase: aggregator ranks gather neighbouring rows and write them); individual: the same "
       "collective HDF5 calls, each rank writing its own rows underneath. The bits of the file are the same "
       "in every mode."},
      {"HK_HOST_HUGEPAGES", "1|0", "1", "io",
       "hk_forward's chunk buffers (64 MiB each on a GPU run) on transparent huge pages: aligned to 2 MiB and "
       "marked MADV_HUGEPAGE, so that their first fill and their page-locking take 2 MiB faults instead of "
       "4 KiB ones (where the kernel's transparent_hugepage setting is madvise or always). 0: ordinary pages."},
      {"HK_INPUT_BUFFERS", "auto|2..8", "auto", "io",
       "Input chunk buffers of hk_forward's pipeline: how many chunks the reader may read ahead of the "
       "compute. auto: 3 with a GPU (the reader reads ahead while the driver, the context and the engine "
       "start; four measured slower), 2 otherwise. More helps a file system with uneven reads, at 64 MiB of host memory each on a "
       "GPU run (counted in the chunk sizing under --mem-cap)."},
      {"HK_WRITE_BACK", "async|inline|off", "async", "io",
       "Starting the disk write of each output chunk as soon as it is written (sync_file_range), so that the "
       "final fsync has little left. async: requested on a thread of its own (the request waits when the "
       "device's queue is full, the writer does not); inline: on the writer's thread; off: only the final "
       "fsync writes. For the rows written past HDF5 (one process; HK_MPIIO_WRITE posix and mmap); the MPI-IO "
       "modes request it inline."},
      {"HK_CUDA_POISON", "0|1", "0", "tests",
       "1: fill the CUDA engine's arena with NaN at construction so a read of an unwritten element reaches "
       "the output."},
      {"HK_DATA_DIR", "DIR", "<prefix>/share/hk, then the source tree's data/", "data",
       "Where hk_forward and the golden tests find the shipped data (sample.h5, goldens)."},
      {"HK_CASES_CSV", "FILE", "the source tree's spec cases", "benchmarks",
       "cases.csv read by the host benchmark hk_bench_host."},
  };
  return table;
}

const Knob* find_knob(const std::string& name) {
  for (const Knob& k : knobs())
    if (name == k.name) return &k;
  return nullptr;
}

std::string knob_value(const char* name) {
  if (!find_knob(name)) throw Error(std::string("internal: environment knob ") + name + " is not registered");
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string knob_choice(const char* name, const std::vector<std::string>& allowed) {
  const std::string v = knob_value(name);
  if (v.empty()) return v;
  for (const std::string& a : allowed)
    if (v == a) return v;
  std::string list;
  for (const std::string& a : allowed) list += (list.empty() ? "'" : ", '") + a + "'";
  throw Error(std::string(name) + " must be one of " + list + ", got '" + v + "'");
}

bool tune_enabled() { return knob_choice("HK_TUNE", {"0", "1"}) != "0"; }

std::string describe_knobs() {
  std::string out;
  std::string area;
  for (const Knob& k : knobs()) {
    if (area != k.area) {
      area = k.area;
      out += (out.empty() ? "" : "\n") + area + ":\n";
    }
    const char* v = std::getenv(k.name);
    out += "  " + std::string(k.name) + "=" + k.values + "   (default: " + k.fallback + ")" +
           (v ? std::string("   now: '") + v + "'" : std::string()) + "\n";
    // Doc wrapped at ~96 columns under the name.
    std::string line = "      ";
    std::string word;
    auto flush_word = [&] {
      if (word.empty()) return;
      if (line.size() + word.size() > 100 && line.size() > 6) {
        line.pop_back();
        out += line + "\n";
        line = "      ";
      }
      line += word + " ";
      word.clear();
    };
    for (const char* c = k.doc; *c; ++c) {
      if (*c == ' ') {
        flush_word();
      } else {
        word += *c;
      }
    }
    flush_word();
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

}  // namespace hk::tune
