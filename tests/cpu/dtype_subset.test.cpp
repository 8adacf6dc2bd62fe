// RECCL_DTYPES narrows the dtypes whose reducing GPU kernels a program compiles (types.hpp). This
// file is built the way a user opts in: the macro is defined before any reccl header. The GPU side
// (nothing instantiated for the others, the entry points throwing) is tests/device/dtype_subset.test.cu.
#define RECCL_DTYPES bfloat16 | float32
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <string>

#include <reccl/error.hpp>
#include <reccl/types.hpp>

using reccl::collective;
using reccl::dtype;

TEST_CASE("RECCL_DTYPES selects exactly the dtypes it names") {
  static_assert(reccl::compiled_dtypes == (reccl::dtype_bits::bfloat16 | reccl::dtype_bits::float32));
  CHECK(reccl::dtype_compiled(dtype::bfloat16));
  CHECK(reccl::dtype_compiled(dtype::float32));
  for (dtype t : {dtype::int32, dtype::int64, dtype::float16, dtype::float64}) CHECK_FALSE(reccl::dtype_compiled(t));
  // each name is the bit of its enumerator, so a mask and a dtype agree
  CHECK(reccl::dtype_bits::float64 == 1u << static_cast<unsigned>(dtype::float64));
  CHECK(reccl::dtype_bits::int32 == 1u << static_cast<unsigned>(dtype::int32));
}

TEST_CASE("a reduction on a dtype left out is a clear error, a copy is not") {
  for (collective c : {collective::all_reduce, collective::reduce_scatter}) {
    try {
      reccl::require_compiled(c, dtype::float64);
      FAIL("no error for a reduction on a dtype left out");
    } catch (reccl::error const& e) {
      CHECK(e.code() == reccl::status::invalid_argument);
      std::string const w = e.what();
      CHECK(w.find(std::string(reccl::name(c)) + " on double") != std::string::npos);
      CHECK(w.find("RECCL_DTYPES=bfloat16|float32") != std::string::npos);
      CHECK(w.find("float64") != std::string::npos);
    }
    CHECK_NOTHROW(reccl::require_compiled(c, dtype::bfloat16));
    CHECK_NOTHROW(reccl::require_compiled(c, dtype::float32));
  }
  for (collective c : {collective::all_gather, collective::broadcast, collective::all_to_all})
    CHECK_NOTHROW(reccl::require_compiled(c, dtype::float64));
}
