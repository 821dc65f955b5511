// Execution settings of the fused engine: thread count and the SIMD targets dispatch may choose
// from.
//
// Results never depend on these settings: the element range is cut into chunks whose edges depend
// only on the sizes, and every element is computed by the same code on every thread. Only FMA vs
// non-FMA targets differ in the last bits (documented in docs/numerics.md).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace fusedopt {

// Elements per work unit: a multiple of 256 so chunk edges are cache-line aligned for every dtype
// and vector.
inline constexpr std::size_t kGrainElements = 32768;

// The most threads a Runtime takes: far above any machine's cores, far below what makes OpenMP
// fail to start a team (a trace's `threads: 1e9`).
inline constexpr int kMaxThreads = 4096;

class Runtime {
 public:
  // num_threads == 0 means "as many as OpenMP would use" (OMP_NUM_THREADS or the core count).
  explicit Runtime(int num_threads = 0);

  int num_threads() const { return num_threads_; }
  // Throws fusedopt::Error for a count outside [0, kMaxThreads].
  void set_num_threads(int num_threads);

 private:
  int num_threads_;
};

// The process-wide runtime used when a step is given none.
Runtime& DefaultRuntime();

// How many threads each of the ranks that share a host steps with, and why (for people).
struct ThreadChoice {
  int threads;
  std::string reason;  // e.g. "OMP_NUM_THREADS=2", "2 CPUs shared by 2 ranks on this host"
};

// The thread count of one of `local_ranks` processes on a host, in this order: `requested` when
// > 0 (an explicit option), then OMP_NUM_THREADS (`omp_num_threads`, null when unset; its first
// number, as OpenMP reads it), then the `cpus` this process may run on divided among the host's
// ranks (at least 1). Left to OpenMP, every rank would start a thread per CPU, and ranks that
// share the CPUs would run more threads than there are CPUs (docs/distributed.md has the cost).
// Throws fusedopt::Error for counts < 1.
ThreadChoice ChooseThreadsPerRank(int requested, const char* omp_num_threads, int cpus,
                                  int local_ranks);
// The same for this process: OMP_NUM_THREADS from the environment, the CPUs from
// omp_get_num_procs().
ThreadChoice ThreadsPerRank(int requested, int local_ranks);

// Names of the SIMD targets this build compiled that this CPU supports, best first (e.g. "AVX2",
// "SSE4").
std::vector<std::string> AvailableTargets();
// Name of the target the next step will run on.
std::string ActiveTargetName();
// A target's name for people: Highway's name plus the instruction set it is known by where the
// two differ ("AVX3 (AVX-512)"); JSON reports keep the bare name.
std::string TargetDescription(const std::string& name);
// Restricts dispatch to the named target (one of AvailableTargets()); an empty name restores the
// default (best available, minus any listed in the environment variable FOPT_DISABLE_TARGETS,
// comma-separated). Process-wide: meant for tests and benchmarks, not for concurrent use with
// running steps. AVX3_DL is compiled only for the 8-bit states' codecs (its VBMI decode): forced,
// the other kernels run their AVX3 code; with AVX3 disabled it is not used either.
//
// FOPT_DISABLE_TARGETS is read when the first Runtime is made or the targets are first asked
// for (never at static-initialization time); a name this build does not compile makes those calls
// throw fusedopt::Error naming it and listing the valid names.
void ForceTarget(const std::string& name);

}  // namespace fusedopt
