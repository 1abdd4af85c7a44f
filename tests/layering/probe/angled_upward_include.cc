// Compiled as part of the graph layer by tests/layering (never built by default): the same upward include
// as quoted_upward_include.cc, spelled with angle brackets, must not be found either.
#include <graphalloc/rng/generator.h>
