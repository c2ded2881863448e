/* Test fixtures shared by the pipeline's unit tests (test_rt_pipeline,
 * test_rt_declog). Include after CUnit and router/pipeline.h. */
#ifndef TANDEM_TEST_PL_FIXTURE_H
#define TANDEM_TEST_PL_FIXTURE_H

/* Adds endpoint id of role (block size 16, 16 running seqs); fails the test
 * when the pipeline refuses it. Returns the slot. */
static inline int add_ep(struct rt_pipeline *pl, const char *id, enum rt_role role)
{
    struct rt_endpoint_info in = {
        .id = id, .role = role, .block_size = 16, .max_running = 16, .data_addr = "ipc:///x"};
    int ep = rt_pipeline_endpoint_add(pl, &in);
    CU_ASSERT_FATAL(ep >= 0);
    return ep;
}

#endif
