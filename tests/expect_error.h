// expect_error: the call must throw longtron::Error whose message contains every given part
// (the errors a user meets name the file, key or constraint; the tests check those names).
#pragma once
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "core/error.h"

namespace longtron::testing {

template <typename F>
void expect_error(F&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing: " << *parts.begin();
  } catch (const Error& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message '" << e.what() << "' lacks '" << p << "'";
  }
}

}  // namespace longtron::testing
