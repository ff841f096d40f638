/*
 * The CUDA backend's host arithmetic (src/backend/cuda_host.c), checked without a GPU: built only
 * with -DL3D_CUDA=ON, ctest label nogpu (run by `make test` when nvcc exists). Every check compares
 * with values worked out by hand, and each family has a case that must be rejected.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda_host.h"
#include "test.h"

static void test_local_rank(void) {
    unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
    unsetenv("MPI_LOCALRANKID");
    unsetenv("SLURM_LOCALID");
    CHECK(l3d_cuda_env_local_rank() == -1);
    setenv("SLURM_LOCALID", "5", 1);
    CHECK(l3d_cuda_env_local_rank() == 5);
    setenv("MPI_LOCALRANKID", "2", 1); /* MPICH's before Slurm's */
    CHECK(l3d_cuda_env_local_rank() == 2);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1); /* Open MPI's first */
    CHECK(l3d_cuda_env_local_rank() == 3);
    /* negative: text that is not a non-negative integer is skipped, the next variable read */
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3x", 1);
    CHECK(l3d_cuda_env_local_rank() == 2);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "-1", 1);
    CHECK(l3d_cuda_env_local_rank() == 2);
    unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
    unsetenv("MPI_LOCALRANKID");
    unsetenv("SLURM_LOCALID");

    /* ranks 0..5 on nodes 0 0 1 0 1 1: local ranks 0 1 0 2 1 2 */
    const int node_of[6] = {0, 0, 1, 0, 1, 1}, want[6] = {0, 1, 0, 2, 1, 2};
    for (int r = 0; r < 6; r++) CHECK(l3d_cuda_local_rank_of(node_of, 6, r) == want[r]);

    CHECK(l3d_cuda_pick_device(0, 8) == 0);
    CHECK(l3d_cuda_pick_device(7, 8) == 7);
    CHECK(l3d_cuda_pick_device(9, 8) == 1); /* more ranks than devices: wrap */
    CHECK(l3d_cuda_pick_device(3, 1) == 0);
    CHECK(l3d_cuda_pick_device(-1, 4) == 0);
    CHECK(l3d_cuda_pick_device(2, 0) == -1); /* no device */
}

static void test_comm_choice(void) {
    int a, b;
    /* 4 ranks, 2 nodes, devices 0 1 on each: NCCL */
    const int node4[4] = {0, 0, 1, 1}, dev4[4] = {0, 1, 0, 1};
    CHECK(l3d_cuda_comm_choice(node4, dev4, 4, &a, &b) == L3D_CUDA_COMM_NCCL);
    CHECK(a == -1 && b == -1);
    /* the same device numbers on different nodes are different devices */
    const int node2[2] = {0, 1}, dev2[2] = {0, 0};
    CHECK(l3d_cuda_comm_choice(node2, dev2, 2, &a, &b) == L3D_CUDA_COMM_NCCL);
    /* negative: two ranks of one node on one device (2 ranks, 1 GPU): staged, naming them */
    const int node3[3] = {0, 0, 0}, dev3[3] = {0, 1, 1};
    CHECK(l3d_cuda_comm_choice(node3, dev3, 3, &a, &b) == L3D_CUDA_COMM_STAGED);
    CHECK(a == 1 && b == 2);
    /* the device picked by local rank mod devices: 2 ranks on a 1-GPU node share it */
    int d0 = l3d_cuda_pick_device(0, 1), d1 = l3d_cuda_pick_device(1, 1);
    const int one_node[2] = {0, 0};
    const int devs[2] = {d0, d1};
    CHECK(l3d_cuda_comm_choice(one_node, devs, 2, &a, &b) == L3D_CUDA_COMM_STAGED);
    CHECK(l3d_cuda_comm_choice(one_node, devs, 1, &a, &b) == L3D_CUDA_COMM_NCCL);
}

static void test_launch(void) {
    struct l3d_cuda_launch l = l3d_cuda_launch_1d(1000, 256, 4096);
    CHECK(l.blocks == 4 && l.threads == 256);
    l = l3d_cuda_launch_1d(1024, 256, 4096);
    CHECK(l.blocks == 4);
    l = l3d_cuda_launch_1d(1025, 256, 4096);
    CHECK(l.blocks == 5);
    l = l3d_cuda_launch_1d(0, 256, 4096);
    CHECK(l.blocks == 0);
    l = l3d_cuda_launch_1d((int64_t)1 << 40, 512, 8192); /* capped: the grid-stride loop covers */
    CHECK(l.blocks == 8192 && l.threads == 512);
    l = l3d_cuda_launch_rows(10, 4);
    CHECK(l.blocks == 3 && l.threads == 128);
    l = l3d_cuda_launch_rows(8, 4);
    CHECK(l.blocks == 2);
    CHECK(l3d_cuda_attn_per_lane(64) == 2);
    CHECK(l3d_cuda_attn_per_lane(8) == 1);
    CHECK(l3d_cuda_attn_per_lane(33) == 2);
    CHECK(l3d_cuda_attn_per_lane(256) == 8);
    /* negative: shapes the kernel cannot hold */
    CHECK(l3d_cuda_attn_per_lane(257) == 0);
    CHECK(l3d_cuda_attn_per_lane(0) == 0);
}

/* the table against a plain array of the live allocations, through growth and deletions in the
 * middle of probe runs */
static void test_allocs(void) {
    struct l3d_cuda_allocs t = {0};
    enum { N = 1000 };
    static uintptr_t addr[N];
    static size_t size[N];
    static bool live[N];
    size_t total = 0, count = 0, got = 0;
    for (int i = 0; i < N; i++) {
        /* distinct, scattered 256-byte aligned addresses (an odd multiplier is a bijection mod 2^20) */
        addr[i] = 0x7f0000000000u + (((uintptr_t)i * 2654435761u) & 0xfffff) * 256;
        size[i] = (size_t)(i + 1) * 100;
        l3d_cuda_allocs_add(&t, (void *)addr[i], size[i]);
        live[i] = true;
        total += size[i];
        count++;
    }
    CHECK(t.total == total && t.count == count);
    for (int i = 0; i < N; i += 3) { /* every third one freed */
        CHECK(l3d_cuda_allocs_remove(&t, (void *)addr[i], &got));
        CHECK(got == size[i]);
        live[i] = false;
        total -= size[i];
        count--;
    }
    CHECK(t.total == total && t.count == count);
    bool all_found = true;
    for (int i = 0; i < N; i++) {
        if (!live[i]) continue;
        size_t b = 0;
        all_found &= l3d_cuda_allocs_remove(&t, (void *)addr[i], &b) && b == size[i];
        l3d_cuda_allocs_add(&t, (void *)addr[i], size[i]); /* put back */
    }
    CHECK(all_found);
    /* negative: a freed pointer, a foreign one and NULL are not allocations */
    CHECK(!l3d_cuda_allocs_remove(&t, (void *)addr[0], &got));
    CHECK(!l3d_cuda_allocs_remove(&t, (void *)(addr[1] + 8), &got));
    CHECK(!l3d_cuda_allocs_remove(&t, NULL, &got));
    CHECK(t.total == total && t.count == count);
    l3d_cuda_allocs_free(&t);
    CHECK(t.count == 0 && t.total == 0);
}

/* the plan cache: hits, the filling order, then round-robin replacement once full */
static void test_plans(void) {
    struct l3d_cuda_plan_table t = {0};
    bool hit, evict;
    struct l3d_cuda_mm_key k = {1, 0, 768, 4096, 2304, 2, 2, 768, 768, 2304, 1, 256, 256, 256};
    CHECK(l3d_cuda_plan_slot(&t, &k, &hit, &evict) == 0 && !hit && !evict);
    CHECK(l3d_cuda_plan_slot(&t, &k, &hit, &evict) == 0 && hit && !evict);
    /* negative: a key that differs in one field (here only the alignment of A) is another plan */
    struct l3d_cuda_mm_key k2 = k;
    k2.align_a = 2;
    CHECK(l3d_cuda_plan_slot(&t, &k2, &hit, &evict) == 1 && !hit);
    k2 = k;
    k2.bias = 0;
    CHECK(l3d_cuda_plan_slot(&t, &k2, &hit, &evict) == 2 && !hit);
    for (int i = 3; i < L3D_CUDA_PLANS; i++) { /* fill the table: n = 1.. */
        struct l3d_cuda_mm_key ki = k;
        ki.n = i;
        CHECK(l3d_cuda_plan_slot(&t, &ki, &hit, &evict) == i && !hit && !evict);
    }
    CHECK(t.used == L3D_CUDA_PLANS);
    struct l3d_cuda_mm_key kn = k;
    kn.n = 100000; /* full: slot 0 is replaced, then 1 */
    CHECK(l3d_cuda_plan_slot(&t, &kn, &hit, &evict) == 0 && !hit && evict);
    CHECK(l3d_cuda_plan_slot(&t, &kn, &hit, &evict) == 0 && hit);
    CHECK(l3d_cuda_plan_slot(&t, &k, &hit, &evict) == 1 && !hit && evict); /* k was evicted */
    CHECK(t.used == L3D_CUDA_PLANS && t.next == 2);

    CHECK(l3d_cuda_align((void *)(uintptr_t)0x7f0000001000u) == 256);
    CHECK(l3d_cuda_align((void *)(uintptr_t)0x7f0000001080u) == 128);
    CHECK(l3d_cuda_align((void *)(uintptr_t)0x7f0000001006u) == 2);
    CHECK(l3d_cuda_align((void *)(uintptr_t)0x7f0000001001u) == 1);
}

static void test_peak(void) {
    const char *src;
    struct l3d_cuda_dev sxm = {"NVIDIA H100 80GB HBM3", 9, 0, 132, 1980000};
    CHECK_NEAR(l3d_cuda_peak(&sxm, L3D_BF16, &src), 989.4e12, 1e9);
    CHECK(src && strstr(src, "H100"));
    CHECK_NEAR(l3d_cuda_peak(&sxm, L3D_F32, &src), 66.9e12, 1e9);
    struct l3d_cuda_dev pcie = {"NVIDIA H100 PCIe", 9, 0, 114, 1755000};
    CHECK_NEAR(l3d_cuda_peak(&pcie, L3D_BF16, &src), 756.5e12, 1e9);
    struct l3d_cuda_dev h200 = {"NVIDIA H200", 9, 0, 132, 1980000};
    CHECK_NEAR(l3d_cuda_peak(&h200, L3D_F16, &src), 989.4e12, 1e9);
    /* not in the table: SMs x clock x 4096 (Hopper) */
    struct l3d_cuda_dev other = {"NVIDIA GH-something", 9, 0, 100, 1500000};
    CHECK_NEAR(l3d_cuda_peak(&other, L3D_BF16, &src), 100 * 1.5e9 * 4096, 1e6);
    CHECK(src && strstr(src, "SMs"));
    /* negative: types without products, and an architecture the backend has no rate for */
    CHECK(l3d_cuda_peak(&sxm, L3D_I32, &src) == 0.0 && src == NULL);
    struct l3d_cuda_dev old = {"Tesla V100", 7, 0, 80, 1530000};
    CHECK(l3d_cuda_peak(&old, L3D_BF16, &src) == 0.0);
}

int main(void) {
    test_local_rank();
    test_comm_choice();
    test_launch();
    test_allocs();
    test_plans();
    test_peak();
    return TEST_REPORT();
}
