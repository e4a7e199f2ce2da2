// The checking mode (attnprof/check_inputs.h): a thread's scope turns it on
// or off whatever the environment says, scopes nest, and the previous setting
// comes back when a scope ends or a front end exchanges it back.
#include "attnprof/check_inputs.h"

#include <gtest/gtest.h>

#include <thread>

namespace attnprof {
namespace {

TEST(CheckingInputs, AScopeSetsItForItsThreadOnly) {
  const bool environment = checking_inputs();
  {
    const CheckingInputs on(true);
    EXPECT_TRUE(checking_inputs());
    bool other = true;
    std::thread([&] { other = checking_inputs(); }).join();
    EXPECT_EQ(other, environment) << "another thread keeps the environment's setting";
    {
      const CheckingInputs off(false);
      EXPECT_FALSE(checking_inputs());
    }
    EXPECT_TRUE(checking_inputs()) << "the outer scope's setting comes back";
  }
  EXPECT_EQ(checking_inputs(), environment);
}

TEST(CheckingInputs, ExchangeReturnsThePreviousSetting) {
  EXPECT_EQ(exchange_checking_inputs(1), -1);
  EXPECT_TRUE(checking_inputs());
  EXPECT_EQ(exchange_checking_inputs(0), 1);
  EXPECT_FALSE(checking_inputs());
  EXPECT_EQ(exchange_checking_inputs(-1), 0);
}

}  // namespace
}  // namespace attnprof
