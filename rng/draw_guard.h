// Catches a draw from a generator that a graph being recorded does not know about. A capture bakes an
// eager (seed, offset) into the graph, so every replay would repeat the same numbers; only generators in
// capture mode (Generator::BeginCapture, which GraphTree does for FunctionOptions::generators) hand out
// replay-safe arguments. While a DrawGuard lives on a thread, Generator::Reserve outside capture mode on
// that thread fails with an error naming the generator and the guarded function. Draws made on other
// threads during the capture are not seen.
#ifndef GRAPHALLOC_RNG_DRAW_GUARD_H_
#define GRAPHALLOC_RNG_DRAW_GUARD_H_

#include <string_view>

namespace graphalloc {

class DrawGuard {
 public:
  // `function` names what is being recorded, for the error; it must outlive the guard.
  explicit DrawGuard(std::string_view function);
  ~DrawGuard();
  DrawGuard(const DrawGuard&) = delete;
  DrawGuard& operator=(const DrawGuard&) = delete;

  // The innermost guarded function on this thread, or nullptr when none.
  static const std::string_view* Active();

 private:
  std::string_view function_;
  const std::string_view* outer_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_RNG_DRAW_GUARD_H_
