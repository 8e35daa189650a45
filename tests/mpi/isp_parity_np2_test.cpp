// ISP (Ulysses + weight parallel) through the engine on 2 ranks against one process on the same
// global batch (see isp_parity.h): T=2, W != T, overlap on/off, activation recomputation,
// unpacked rows and a row whose second sequence shard is all padding.
#include "isp_parity.h"
#include "modes/isp_ops.h"
#include "packing/sequence_split.h"

namespace longtron::testing {
namespace {

TEST(IspParityNp2, T2) { check_isp_parity({"isp2", isp(2, 2)}); }

// A tied embedding/head: one table split on vocabulary rows over WEIGHT (101: uneven), gathered
// for the lookup and for the head.
TEST(IspParityNp2, T2Tied) {
  IspCase c{"isp2 tied", isp(2, 2)};
  c.model = tied_model();
  check_isp_parity(c);
  IspCase o{"isp2 tied overlap", isp(2, 2, /*overlap=*/true)};
  o.model = tied_model();
  check_isp_parity(o);
  IspCase w{"isp1 W=2 dp2 tied", isp(1, 2)};
  w.model = tied_model();
  check_isp_parity(w);
}

TEST(IspParityNp2, T2WeightOne) { check_isp_parity({"isp2 W=1 (W != T)", isp(2, 1)}); }

TEST(IspParityNp2, T1Weight2) { check_isp_parity({"isp1 W=2 dp2 (W != T)", isp(1, 2)}); }

TEST(IspParityNp2, OverlapOnAndOff) { check_overlap_identical({"isp2", isp(2, 2)}); }

TEST(IspParityNp2, Checkpoint) {
  IspCase c{"isp2 checkpoint", isp(2, 2)};
  c.model.checkpoint = true;
  check_overlap_identical(c);
}

TEST(IspParityNp2, KvHeadRepeated) {
  IspCase c{"isp2 1 kv head (repeated)", isp(2, 2)};
  c.model = tiny_model(1);
  check_isp_parity(c);
}

TEST(IspParityNp2, Unpacked) {
  IspCase c{"isp2 unpacked", isp(2, 2)};
  c.row = unpacked_rows(/*seq_len=*/8, /*micro_bsz=*/2, /*max_len=*/8, c.model.vocab_size);
  check_isp_parity(c);
}

TEST(IspParityNp2, ShardAllPadding) {
  // 2 documents of <= 4 tokens in a 16-token row: tokens 8..15 (rank 1's shard) are all pad.
  IspCase c{"isp2 rank-1 shard all pad", isp(2, 2)};
  c.row = unpacked_rows(8, 2, 4, c.model.vocab_size);
  check_isp_parity(c);
}

// The prefetcher predicts from the previous pass: on the second call every prefetch is used.
TEST(IspParityNp2, OverlapPrefetchesAreUsed) {
  for (bool ckpt : {false, true}) {
    model::ModelConfig cfg = tiny_model();
    cfg.checkpoint = ckpt;
    parallel::Grid grid = parallel::make_grid(world(), isp(2, 2, true));
    model::ParamTable full(cfg);
    model::Params<float> params(full), local(full), grads(full);
    model::init_params(params, 42);
    parallel::isp_scatter_params(local, params, parallel::isp_shard_plan(full, 2, grid.weight->rank()));
    std::shared_ptr<parallel::IspWeightStore> store;
    model::Decoder<float> net(full, local, parallel::make_isp_ops(full, grid, true, &store));
    const MicroBatch row = random_row(16, cfg.vocab_size, 3);
    const MicroBatch mine = data::split_for_sequence_parallel(row, 2, grid.tensor->rank());
    net.forward_backward(mine, grads, 0.1);
    EXPECT_EQ(store->prefetches_started(), 0);  // first pass: recording the order
    net.forward_backward(mine, grads, 0.1);
    net.forward_loss(mine);
    net.forward_backward(mine, grads, 0.1);
    if (world()->rank() == 0)
      std::printf("[isp-overlap] ckpt %d: %lld prefetches started, %lld used\n", int(ckpt),
                  (long long)store->prefetches_started(), (long long)store->prefetches_used());
    EXPECT_GT(store->prefetches_used(), 0);
    EXPECT_GE(store->prefetches_used() + 2, store->prefetches_started());
  }
}

}  // namespace
}  // namespace longtron::testing
