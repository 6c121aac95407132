// One include for Catch2 2.x and 3.x.
#pragma once

#if defined(KDAJIT_CATCH2_V3)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif
