// Compiled as part of the graph layer by tests/layering (never built by default): the graph layer may not
// include the rng layer, which sits above it, so this include must not be found.
#include "graphalloc/rng/generator.h"
