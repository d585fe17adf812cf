// Host work spread over the cores: the generator's rows, the reference check's tokens.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace swa_decode::testing {

// Every core the host reports (at least 1).
inline int host_threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

// Runs body(begin, end) over [0, count) in pieces of `grain`, handed out in order to up to
// `threads` threads (the calling one included when there is one piece); the first exception a
// piece throws is rethrown after every thread has joined. Pieces must not depend on each other.
template <typename Body>
void parallel_for(int64_t count, int64_t grain, int threads, const Body& body) {
  if (count <= 0) return;
  const int64_t pieces = (count + grain - 1) / grain;
  const int64_t workers_wanted = std::min<int64_t>(pieces, std::max(1, threads));
  if (workers_wanted <= 1) {
    body(int64_t{0}, count);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  std::vector<std::thread> workers;
  for (int64_t i = 0; i < workers_wanted; ++i) {
    workers.emplace_back([&] {
      for (int64_t piece; (piece = next.fetch_add(1)) < pieces;) {
        try {
          body(piece * grain, std::min(count, (piece + 1) * grain));
        } catch (...) {
          std::lock_guard<std::mutex> lock(failure_mutex);
          if (!failure) failure = std::current_exception();
        }
      }
    });
  }
  for (std::thread& worker : workers) worker.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace swa_decode::testing
