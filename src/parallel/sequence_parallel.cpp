// XTuner-named sequence-parallel API (see sequence_parallel.h).
#include "parallel/sequence_parallel.h"

#include "core/error.h"
#include "packing/sequence_split.h"

namespace longtron::parallel {

SequenceParallelGroups init_sequence_parallel(const comm::CommPtr& world,
                                              int sequence_parallel_size, int context_size,
                                              data::ContextBalance balance) {
  const int sp = sequence_parallel_size, n = world->size(), r = world->rank();
  check(sp >= 1 && n % sp == 0,
        "init_sequence_parallel: the world size {} is not divisible by sequence_parallel_size {}",
        n, sp);
  SequenceParallelGroups g;
  g.sp = world->split(r / sp, r);  // contiguous blocks
  g.dp = world->split(r % sp, r);  // stride sp
  check(context_size >= 1 && sp % context_size == 0,
        "init_sequence_parallel: context_size {} does not divide sequence_parallel_size {}",
        context_size, sp);
  g.balance = balance;
  if (context_size == 1) {
    g.head = g.sp;
    g.context = comm::make_local_communicator();
  } else {  // head-first: head rank h = t % (sp / C), context rank c = t / (sp / C)
    const int hp = sp / context_size, t = g.sp->rank();
    g.head = g.sp->split(t / hp, t % hp);
    g.context = g.sp->split(t % hp, t / hp);
  }
  return g;
}

data::SequenceParallelSampler make_sequence_parallel_sampler(const SequenceParallelGroups& groups,
                                                             int64_t num_samples, bool shuffle,
                                                             uint32_t seed, bool round_up) {
  // The sampler derives dp rank/size from (world size, sp size, world rank) with the same
  // contiguous-SP rule; pass the equivalent world coordinates of this rank.
  const int64_t sp = groups.sp_size(), world = sp * groups.dp_size();
  const int64_t rank = groups.dp_rank() * sp + groups.sp_rank();
  return data::SequenceParallelSampler(num_samples, world, sp, rank, shuffle, seed, round_up);
}

data::MicroBatch pad_and_split_for_sequence_parallel(data::MicroBatch row,
                                                     const SequenceParallelGroups& groups) {
  if (groups.context && groups.context->size() > 1)
    return data::split_for_context_parallel(row, groups.head->size(), groups.head->rank(),
                                            groups.context->size(), groups.context->rank(),
                                            groups.balance);
  data::pad_for_sequence_parallel(row, groups.sp_size());
  return data::split_for_sequence_parallel(row, groups.sp_size(), groups.sp_rank());
}

double reduce_sequence_parallel_loss(double mean_loss, int64_t num_tokens,
                                     comm::Communicator& sp_group) {
  check(num_tokens >= 0, "reduce_sequence_parallel_loss: num_tokens {} is negative", num_tokens);
  double buf[2] = {num_tokens > 0 ? mean_loss * double(num_tokens) : 0.0, double(num_tokens)};
  sp_group.all_reduce(buf, 2);
  return buf[1] > 0 ? buf[0] / buf[1] : 0.0;
}

}  // namespace longtron::parallel
