/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The few kernel types sampler.bpf.c uses, declared by hand instead of a 3 MB vmlinux.h
 * generated from one kernel. CO-RE needs only the fields a program touches: with
 * preserve_access_index, libbpf relocates every field access against the running kernel's
 * BTF at load time, so these declarations need not match any kernel's layout.
 */
#ifndef GLEANER_VMLINUX_MIN_H
#define GLEANER_VMLINUX_MIN_H

typedef signed char __s8;
typedef unsigned char __u8;
typedef short __s16;
typedef unsigned short __u16;
typedef int __s32;
typedef unsigned int __u32;
typedef long long __s64;
typedef unsigned long long __u64;
typedef __u8 u8;
typedef __u16 u16;
typedef __u32 u32;
typedef __s32 s32;
typedef __u64 u64;
typedef __s64 s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef _Bool bool;
#define true 1
#define false 0

enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_TASK_STORAGE = 29,
};

/* Task storage must be allocated on demand. */
#define BPF_F_NO_PREALLOC (1U << 0)
#define BPF_LOCAL_STORAGE_GET_F_CREATE (1ULL << 0)

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
	BPF_EXIST = 2,
};

#if defined(__TARGET_ARCH_x86)
struct pt_regs {
	long unsigned int r15, r14, r13, r12, bp, bx, r11, r10, r9, r8, ax, cx, dx, si, di, orig_ax, ip, cs, flags, sp, ss;
} __attribute__((preserve_access_index));
#elif defined(__TARGET_ARCH_arm64)
struct user_pt_regs {
	__u64 regs[31];
	__u64 sp;
	__u64 pc;
	__u64 pstate;
};
struct pt_regs {
	union {
		struct user_pt_regs user_regs;
		struct {
			u64 regs[31];
			u64 sp;
			u64 pc;
			u64 pstate;
		};
	};
} __attribute__((preserve_access_index));
#endif

struct task_struct {
	int on_rq;
	int pid;
	int tgid;
} __attribute__((preserve_access_index));

/* The kernel's own per-CPU idle record (kernel/time/tick-sched.h), read by
 * snapshot_tick_idle, and the hrtimer embedded in it that on_hrtimer_start finds it by. */
typedef s64 ktime_t;

struct hrtimer_cpu_base {
	unsigned int cpu;
} __attribute__((preserve_access_index));

struct hrtimer_clock_base {
	struct hrtimer_cpu_base *cpu_base;
} __attribute__((preserve_access_index));

struct hrtimer {
	void *function;
	struct hrtimer_clock_base *base;
} __attribute__((preserve_access_index));

typedef struct seqcount {
	unsigned int sequence;
} __attribute__((preserve_access_index)) seqcount_t;

struct tick_sched {
	/* Newer kernels keep the state bits here (TS_FLAG_IDLE_ACTIVE: bit 2). */
	unsigned long flags;
	struct hrtimer sched_timer;
	/* Where present, guards the idle times against a reader on another CPU. */
	seqcount_t idle_sleeptime_seq;
	ktime_t idle_entrytime;
	unsigned long idle_calls;
	ktime_t idle_sleeptime;
	ktime_t iowait_sleeptime;
} __attribute__((preserve_access_index));

/* Older kernels keep the idle state in a bitfield. */
struct tick_sched___bitfields {
	unsigned int idle_active : 1;
} __attribute__((preserve_access_index));

#endif
