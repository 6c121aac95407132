// Route twopass of the chunked ops (docs/DESIGN.md, "Route twopass"): the
// prefill kernel of kda_prefill.cu plus its intra-chunk kernel, which runs
// steps 1-4 of every chunk of the call at once into the call's workspace; the
// prefill kernel then copies each chunk's results in instead of computing
// them. KDA_UNIT_BYTES (the generator's, from routes.hpp) is the workspace
// per (unit, head) that the kernel's layout must match.
#define KDA_TWOPASS 1
#include "kda_prefill.cu"
