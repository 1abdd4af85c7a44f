// Compiled as part of the graph layer by tests/layering (never built by default): the control for the two
// upward probes, which shows that a refusal comes from the layering and not from a broken include path.
#include <graphalloc/allocator/core/caching_allocator.h>

#include "graphalloc/graph/graph_tree.h"
