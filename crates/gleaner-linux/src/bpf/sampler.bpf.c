// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Gleaner's in-kernel sampler: counts, per vCPU, what the policy needs each period so that
 * the daemon reads a few maps instead of walking /proc, and measures every wake-up of the
 * workload's threads from the waker's sched_waking (before any IPI or vCPU exit) to the
 * wakee's sched_switch in, split by what the vCPU the wakee ran on was doing at the waking
 * moment. sched_wakeup would be too late: it fires after the target vCPU left HLT, so it
 * hides the blocked-waiter wakeup this project is about.
 *
 * Everything is attached as BTF tracepoints (tp_btf: no tracefs, typed arguments) and reads
 * kernel structures through CO-RE, so one object runs on any kernel with BTF.
 *
 * Cost: sched_switch and sched_waking fire hundreds of thousands of times a second in a
 * ping-pong, so what each event does is measured in the time the workload loses. Per-thread
 * state lives in task-local storage (a pointer hop from the task, freed with it) rather than
 * in hash maps updated and deleted on every switch; whether a task belongs to the workload is
 * decided once per task and generation (`workload_gen`), not looked up by tgid on every event;
 * task fields are read by direct CO-RE loads, not bpf_probe_read calls.
 *
 * Layout contract with src/bpf/mod.rs: struct cpu_stats is 528 u64s in this order.
 */
#include "vmlinux_min.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define NR_BUCKETS 128
#define CLASS_RUNNING 0
#define CLASS_POLLING 1
#define CLASS_HALTED 2
#define NR_CLASSES 3
#define MAX_CPUS 1024
/* CPUs scanned for an idle peer when a queued workload thread finally runs. */
#define MAX_SCAN_CPUS 64
#define PWR_EVENT_EXIT ((u32)-1)

#define KIND_OTHER 0
#define KIND_WORKLOAD 1
#define KIND_RETENTION 2

/* Set by userspace before load: the cpuidle state index that polls (POLL), -1 if none. */
const volatile s32 poll_state = -1;
/* Number of CPU ids to scan for idle peers (min(nr_cpu_ids, MAX_SCAN_CPUS)). */
const volatile u32 scan_cpus = 0;

/* Written by userspace every period: the workload's active vCPUs (bit per CPU id < 64). */
u64 active_mask = 0;
/* Bumped by userspace whenever workload_tgids or retention_tids change: every task's cached
 * kind is then decided again at its next event. */
u32 workload_gen = 1;

/*
 * The measurement window (src/bpf/mod.rs, `KernelSampler::open_window`). A hand-off between
 * two threads costs a sched_waking and a sched_switch, and what those programs do lies on the
 * workload's critical path: measuring every one of 200,000 hand-offs a second made a
 * consolidated ping-pong 25 % slower. So sched_waking and sched_switch measure only from
 * window_start_ns to window_end_ns (switch-ins of threads woken inside the window are timed
 * for GRACE_NS more), and at other times return at their first instruction. Userspace sizes
 * the window each period from the event rate it saw, up to the whole period (`measuring`
 * stays set) for a workload whose events are few; a shorter window lies at the end of the
 * period, and outside it userspace detaches the two programs altogether
 * (`KernelSampler::set_scheduler_programs`): even returning at once, an attached program
 * costs every switch of the machine its dispatch.
 *
 * cpu_idle fires at every idle entry and exit, the exit on the wakee's critical path between
 * the vCPU's return from HLT and the switch to the woken thread: in a ping-pong on two vCPUs
 * (280,000 idle events a second) it cost about 1.3 % of the run time
 * (results/overhead-none-2026-11-26). So it counts idle all the time only until userspace
 * has another source of idle entries and time, and from then on is attached with the
 * scheduler programs, only inside measurement windows, to classify their wake-ups. That
 * source is the cpuidle driver's counters (sysfs `usage` and `time`) where there is a
 * driver, and elsewhere the kernel's own per-CPU idle record, struct tick_sched, which
 * /proc/stat's idle column is read from (see snapshot_tick_idle). tick_sched is a per-CPU
 * variable, and the verifier resolves one only on kernels built with CONFIG_KALLSYMS_ALL,
 * which this project's guests are not ("ldimm64 failed to find the address for kernel
 * symbol 'runqueues'", which failed the whole object's load, 2026-11-27). Its address is
 * found instead through the hrtimer embedded in it, the tick, whose function is a text
 * symbol that kallsyms does list (on_hrtimer_start). The idle task's switches are no count
 * of idle entries: 65.3 M against cpuidle's 56.3 M on CPU 0 since boot, as an idle visit can
 * end before any idle state is entered.
 */
u32 measuring = 1;
u64 window_start_ns = 0;
u64 window_end_ns = ~0ULL;
#define GRACE_NS 2000000ULL
/*
 * Scheduler events one CPU measures in a window at most (userspace sets it: the window's
 * whole expected count, `WINDOW_EVENTS`). A window is sized from the last period's event
 * rate, so a workload that was quiet (idle, starting up, between requests) gets a window of
 * the whole period, and one that turns busy inside it would be measured event by event to
 * its end: `sysbench threads` started 0.3 s after Gleaner ran x1.05 of bare, against x1.016
 * started at once. Past the budget the window ends where it is, for every CPU
 * (`window_end_ns`); userspace reads that end back to scale what the window counted.
 */
u64 window_cpu_events = ~0ULL;

/*
 * When cpu_idle was last attached (0: attached since load). An idle period entered before
 * then was not seen to begin: its time is not counted, and `refresh_idle_state` marks what
 * each CPU is doing when the program comes back.
 */
u64 idle_attached_ns = 0;
#define IDLE_STATE_UNKNOWN (-2)

/* Cumulative per-vCPU counters; each CPU writes only its own copy. */
struct cpu_stats {
	u64 idle_entries;
	u64 idle_ns;
	u64 work_ns;
	u64 work_switches;
	/* Queued time of workload threads while another active vCPU sat idle. */
	u64 crowded_wait_ns;
	/* Scheduler events measured on this CPU (sched_waking, sched_switch, new threads):
	 * their rate sizes the measurement window. */
	u64 events;
	/* hist[class][b >> 5][b & 31] is bucket b: the same memory as [NR_CLASSES][NR_BUCKETS],
	 * in rows of 32 because the Rust skeleton derives Default for this type, which Rust
	 * arrays have only up to 32 long. */
	u64 hist[NR_CLASSES][NR_BUCKETS / 32][32];
	u64 count[NR_CLASSES];
	u64 sum_ns[NR_CLASSES];
	/* Halted-class wake-ups whose waker's CPU went idle (or to a retention thread) before
	 * the wakee ran: the waker waited for it, so the whole latency was on the critical
	 * path. A hold pays only for these (gleaner_policy::gain). */
	u64 halted_waited;
	/* Of the polling and halted wake-ups, how long their vCPU had been idle at the waking
	 * (the same rows of 32 as hist): a hold of h would have caught those under h. The idle
	 * period's own length would not say it, as it holds the halted wake-up's latency. */
	u64 idle_age[NR_BUCKETS / 32][32];
	u64 idle_age_count;
	u64 idle_age_sum_ns;
	/* Of the halted_waited wake-ups, those whose waker ran on another CPU (not an
	 * interrupt on the halted vCPU itself): hand-offs, which packing the pair onto one
	 * vCPU turns into a switch there (gleaner_policy::gain). */
	u64 halted_hand_offs;
	/* How many waits `crowded_wait_ns` adds up: a rate scaled up from a short window to
	 * whole periods needs more than one wait behind it (src/sampler.rs, WindowCounts). */
	u64 crowded_waits;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct cpu_stats);
} stats SEC(".maps");

/* What each CPU is doing, read by other CPUs when they classify a wake-up. */
struct cpu_state {
	u64 idle_enter_ns;
	u64 idle_exit_ns;
	/* Time of the last context switch on this CPU (when `curr_kind` started running). */
	u64 switch_ns;
	s32 idle_state;
	u32 curr_kind;
	/* The window this CPU last measured in (its `window_start_ns`) and this CPU's `events`
	 * when it first saw it: the CPU's share of the window's event budget is counted from
	 * there. */
	u64 window_seen_ns;
	u64 window_base_events;
	/* The idle period (its start) whose age at its first wake-up was recorded: several
	 * wakees queued on one idle vCPU are one idle period caught or not. */
	u64 aged_idle_since;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_CPUS);
	__type(key, u32);
	__type(value, struct cpu_state);
} cpu_states SEC(".maps");

/* The workload's thread groups (tgid -> 1), kept current by userspace and by fork. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, u32);
	__type(value, u8);
} workload_tgids SEC(".maps");

/* Gleaner's retention threads (tid -> 1): a vCPU running one is polling, not busy. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_CPUS);
	__type(key, u32);
	__type(value, u8);
} retention_tids SEC(".maps");

/* A queued wait shorter than this is a hand-off, not a crowd (see on_switch). */
#define CROWDED_MIN_WAIT_NS 1000000ULL

/* What one task is and what it waits for, kept in the task itself. */
struct task_info {
	/* sched_waking of a wake-up whose switch-in is still to come; 0 if none. */
	u64 waking_ns;
	/* When it was preempted or created, if it waits to run since; 0 if not. */
	u64 queued_ns;
	/* workload_gen when `kind` was decided. */
	u32 kind_gen;
	u32 kind;
	/* The CPU `waking_ns` was stamped on (the waker's). */
	u32 waker_cpu;
	u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct task_info);
} task_infos SEC(".maps");

static __always_inline struct cpu_stats *my_stats(void)
{
	u32 zero = 0;
	return bpf_map_lookup_elem(&stats, &zero);
}

static __always_inline struct cpu_state *state_of(u32 cpu)
{
	return bpf_map_lookup_elem(&cpu_states, &cpu);
}

static __always_inline bool is_workload(struct task_struct *p)
{
	u32 tgid = p->tgid;
	return bpf_map_lookup_elem(&workload_tgids, &tgid) != NULL;
}

/* `p`'s storage, created on first sight, with its kind decided for this generation. */
static __always_inline struct task_info *info_of(struct task_struct *p)
{
	struct task_info *ti =
		bpf_task_storage_get(&task_infos, p, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!ti)
		return NULL;
	u32 gen = workload_gen;
	if (ti->kind_gen != gen) {
		u32 pid = p->pid;
		if (is_workload(p))
			ti->kind = KIND_WORKLOAD;
		else if (bpf_map_lookup_elem(&retention_tids, &pid))
			ti->kind = KIND_RETENTION;
		else
			ti->kind = KIND_OTHER;
		ti->kind_gen = gen;
	}
	return ti;
}

/*
 * floor(log2(v)) (0 for v = 0). Without branches: each `(c - v) >> 63` is 1 exactly when
 * v > c (v < 2^63 here), so the verifier walks one path through it instead of one per
 * combination of six branches, times every path of on_switch around it.
 */
static __always_inline u64 log2_floor(u64 v)
{
	u64 r, shift;
	r = ((0xFFFFFFFFULL - v) >> 63) << 5;
	v >>= r;
	shift = ((0xFFFFULL - v) >> 63) << 4;
	v >>= shift;
	r |= shift;
	shift = ((0xFFULL - v) >> 63) << 3;
	v >>= shift;
	r |= shift;
	shift = ((0xFULL - v) >> 63) << 2;
	v >>= shift;
	r |= shift;
	shift = ((0x3ULL - v) >> 63) << 1;
	v >>= shift;
	r |= shift;
	r |= (0x1ULL - v) >> 63;
	return r;
}

/*
 * The latency bucket of v ns, as gleaner_policy::LatencyHistogram::bucket_of computes it:
 * buckets 0..4 hold 0..3 ns; from 4 ns on, the power of two [2^k, 2^(k+1)) splits into four
 * equal parts, bucket 4(k-1) + the two bits below the leading one. A bucket is then at most
 * 25 % wide. Branch-free like log2_floor: `big` (v >= 4) selects between the two forms by
 * multiplication; clamped to the last bucket.
 */
static __always_inline u32 lat_bucket(u64 v)
{
	u64 k = log2_floor(v);
	u64 big = (1ULL - k) >> 63;
	u64 sh = (k - 2) * big;
	u64 b = big * (4 * (k - 1) + ((v >> sh) & 3)) + (1 - big) * v;
	return b >= NR_BUCKETS ? NR_BUCKETS - 1 : (u32)b;
}

/*
 * What `st`'s CPU was doing at `t`: halted or polling if an idle period covered `t` (the last
 * one: a wake-up ends the idle period it lands in), polling if Gleaner's retention thread was
 * running since before `t` (`prev_kind` is what ran until this switch), else running.
 */
static __always_inline u32 classify(struct cpu_state *st, u64 t, u32 prev_kind, u64 *idle_since)
{
	u64 enter = st->idle_enter_ns, exit = st->idle_exit_ns;
	if (enter && enter <= t && (exit < enter || exit >= t)) {
		*idle_since = enter;
		return st->idle_state == poll_state ? CLASS_POLLING : CLASS_HALTED;
	}
	if (prev_kind == KIND_RETENTION && st->switch_ns <= t) {
		*idle_since = st->switch_ns;
		return CLASS_POLLING;
	}
	return CLASS_RUNNING;
}

/* How long, up to `wait`, some other active vCPU has been idle (kernel idle or retention). */
static __always_inline u64 idle_peer_overlap(u32 self, u64 now, u64 wait)
{
	u64 best = 0, mask = active_mask;
	for (u32 cpu = 0; cpu < MAX_SCAN_CPUS; cpu++) {
		if (cpu >= scan_cpus)
			break;
		if (cpu == self || !(mask & (1ULL << cpu)))
			continue;
		struct cpu_state *st = state_of(cpu);
		if (!st)
			continue;
		u64 since = 0;
		if (st->idle_enter_ns > st->idle_exit_ns)
			since = st->idle_enter_ns;
		else if (st->curr_kind == KIND_RETENTION)
			since = st->switch_ns;
		if (since && since < now) {
			u64 d = now - since;
			if (d > best)
				best = d;
		}
	}
	return best < wait ? best : wait;
}

/*
 * Whether the CPU `waker` woke from at `w` stopped running anything since: it entered an
 * idle state, or switched to a retention thread, after `w`. A halted vCPU woken from itself
 * was woken by an interrupt there (its timer): no waker runs on meanwhile, the wake-up's
 * whole latency is the wakee's, as in the policy lab's timer scenarios, where holds gain
 * 5-21 %.
 */
static __always_inline bool waker_waited(u32 waker, u32 self, u64 w)
{
	if (waker == self)
		return true;
	struct cpu_state *ws = state_of(waker);
	if (!ws)
		return false;
	return ws->idle_enter_ns >= w || (ws->curr_kind == KIND_RETENTION && ws->switch_ns >= w);
}

SEC("tp_btf/sched_waking")
int BPF_PROG(on_waking, struct task_struct *p)
{
	if (!measuring)
		return 0;
	struct cpu_stats *s = my_stats();
	if (s)
		s->events++;
	/* Still on a run queue (it had not finished blocking): the kernel only marks it
	 * runnable again, and no switch-in follows that could be timed. */
	if (p->on_rq)
		return 0;
	u64 now = bpf_ktime_get_ns();
	if (now >= window_end_ns)
		return 0;
	struct task_info *ti = info_of(p);
	if (!ti || ti->kind != KIND_WORKLOAD)
		return 0;
	ti->waking_ns = now;
	ti->waker_cpu = bpf_get_smp_processor_id();
	return 0;
}

/* A new thread waits to run from its creation on. */
SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(on_wakeup_new, struct task_struct *p)
{
	struct cpu_stats *s = my_stats();
	if (s)
		s->events++;
	struct task_info *ti = info_of(p);
	if (!ti || ti->kind != KIND_WORKLOAD)
		return 0;
	ti->queued_ns = bpf_ktime_get_ns();
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	if (!measuring)
		return 0;
	u64 now = bpf_ktime_get_ns();
	u64 end = window_end_ns;
	if (end != ~0ULL && now >= end + GRACE_NS) {
		measuring = 0;
		return 0;
	}
	u32 cpu = bpf_get_smp_processor_id();
	struct cpu_stats *s = my_stats();
	struct cpu_state *st = state_of(cpu);
	if (!s || !st)
		return 0;
	s->events++;
	if (st->window_seen_ns != window_start_ns) {
		st->window_seen_ns = window_start_ns;
		st->window_base_events = s->events;
	} else if (s->events - st->window_base_events > window_cpu_events && now < end) {
		/* Over budget: the window ends now; in-flight wake-ups still complete in the
		 * grace time, then every program returns at its first test. */
		window_end_ns = now;
	}

	/* What `prev` is was decided when it switched in: no lookup needed for it, unless that
	 * switch-in came before this window (then neither its kind nor its start is known). */
	u32 prev_kind = st->switch_ns >= window_start_ns ? st->curr_kind : KIND_OTHER;
	if (prev_kind == KIND_WORKLOAD) {
		if (st->switch_ns && now > st->switch_ns)
			s->work_ns += now - st->switch_ns;
		s->work_switches++;
		if (preempt) {
			struct task_info *pi = info_of(prev);
			if (pi) {
				pi->waking_ns = 0;
				pi->queued_ns = now;
			}
		}
	}

	u32 next_kind = KIND_OTHER;
	struct task_info *ni = info_of(next);
	if (ni)
		next_kind = ni->kind;
	if (ni && next_kind == KIND_WORKLOAD) {
		u64 w = ni->waking_ns, q = ni->queued_ns;
		/* A wait that began before this window began in another one: its end was missed. */
		u64 from = window_start_ns;
		if (w < from)
			w = 0;
		if (q < from)
			q = 0;
		if (w || q) {
			/* What the wakee's vCPU was doing when the wake-up began. */
			u32 woke_on = CLASS_RUNNING;
			if (w && now >= w) {
				u64 lat = now - w, idle_since = w;
				u32 c = classify(st, w, prev_kind, &idle_since);
				woke_on = c;
				u32 b = lat_bucket(lat);
				if (c < NR_CLASSES && b < NR_BUCKETS) {
					s->hist[c][b >> 5][b & 31]++;
					s->count[c]++;
					s->sum_ns[c] += lat;
				}
				if (c != CLASS_RUNNING && w >= idle_since &&
				    st->aged_idle_since != idle_since) {
					st->aged_idle_since = idle_since;
					u64 age = w - idle_since;
					u32 ab = lat_bucket(age);
					if (ab < NR_BUCKETS) {
						s->idle_age[ab >> 5][ab & 31]++;
						s->idle_age_count++;
						s->idle_age_sum_ns += age;
					}
				}
				if (c == CLASS_HALTED && waker_waited(ni->waker_cpu, cpu, w)) {
					s->halted_waited++;
					if (ni->waker_cpu != cpu)
						s->halted_hand_offs++;
				}
			}
			/* Only a wait longer than a hand-off counts: a wakee queued for a few
			 * microseconds behind its waker on the same vCPU (wake-affine) is the
			 * pattern consolidation helps, not a crowd that a held vCPU would keep
			 * the load balancer from spreading. A woken thread waits from its
			 * waking (its enqueue follows within microseconds, which a 1 ms
			 * threshold cannot tell apart), a preempted or new one from then.
			 * A wakee whose vCPU was idle when woken queued behind nothing: its
			 * wait is that vCPU's wake-up, however long a contended host made it
			 * (a ping-pong spread over two vCPUs on the `none` guest waited over
			 * 1 ms for halted vCPUs in up to 47 % of a period under 25-41 % steal,
			 * and was kept from the packing that ends those waits). The simulator
			 * counts a crowd the same way: a vCPU with two runnable threads. */
			u64 since = w ? w : q;
			if (now > since + CROWDED_MIN_WAIT_NS && (!w || woke_on == CLASS_RUNNING)) {
				u64 overlap = idle_peer_overlap(cpu, now, now - since);
				if (overlap) {
					s->crowded_wait_ns += overlap;
					s->crowded_waits++;
				}
			}
		}
		ni->waking_ns = 0;
		ni->queued_ns = 0;
	}
	st->curr_kind = next_kind;
	st->switch_ns = now;
	return 0;
}

SEC("tp_btf/cpu_idle")
int BPF_PROG(on_cpu_idle, u32 state, u32 cpu_id)
{
	u64 now = bpf_ktime_get_ns();
	u32 cpu = bpf_get_smp_processor_id();
	struct cpu_stats *s = my_stats();
	struct cpu_state *st = state_of(cpu);
	if (!s || !st)
		return 0;
	/* Not in `events`: those size the measurement window, which this program ignores.
	 * An idle period is counted when it ends, its entry with its time: a window then holds
	 * as many entries as idle periods whose time it holds, and its mean idle period is
	 * right even where one was still under way when the window closed (its entry seen,
	 * its end not), which userspace divides the kernel's idle time by where the kernel's
	 * records count no halts (src/bpf/mod.rs, RecordCounts::TimeOnly). */
	if (state == PWR_EVENT_EXIT) {
		if (st->idle_enter_ns > st->idle_exit_ns && st->idle_enter_ns >= idle_attached_ns) {
			s->idle_ns += now - st->idle_enter_ns;
			s->idle_entries++;
		}
		st->idle_exit_ns = now;
	} else {
		st->idle_state = (s32)state;
		st->idle_enter_ns = now;
	}
	return 0;
}

/*
 * Run by userspace on each CPU right after cpu_idle was attached again (BPF_PROG_TEST_RUN
 * on that CPU: an IPI, two a window), so that no CPU's idle record is left from before the
 * program was detached: one idle since then would read as running (its entry was missed),
 * one that was idle when it was detached and has run since would read as idle all along.
 * Here a CPU running a task is marked not idle; an idle one (the IPI interrupts its idle
 * task) idle since the attach, in a state not known: the IPI ends that idle period at once,
 * and the next one is seen from its entry.
 */
SEC("raw_tp")
int refresh_idle_state(void *ctx)
{
	u32 cpu = bpf_get_smp_processor_id();
	struct cpu_state *st = state_of(cpu);
	if (!st)
		return 0;
	u64 attached = idle_attached_ns;
	bool idle_now = (u32)bpf_get_current_pid_tgid() == 0;
	bool recorded_idle = st->idle_enter_ns > st->idle_exit_ns;
	if (idle_now && !(recorded_idle && st->idle_enter_ns >= attached)) {
		/* Not before an exit the program saw. */
		st->idle_enter_ns =
			attached > st->idle_exit_ns ? attached : st->idle_exit_ns + 1;
		st->idle_state = IDLE_STATE_UNKNOWN;
	} else if (!idle_now && recorded_idle) {
		st->idle_exit_ns = bpf_ktime_get_ns();
	}
	return 0;
}

/*
 * The kernel's own record of each CPU's idle time, for machines without a cpuidle driver.
 * find_tick_function looks up the function of every CPU's tick timer (tick_sched.sched_timer)
 * by name; on_hrtimer_start, attached by userspace until every CPU's record is found, takes
 * the record's address from the timer when the CPU starts its tick again or stops it (as it
 * does on entering and leaving idle), and snapshot_tick_idle, run by userspace once a period
 * (BPF_PROG_TEST_RUN on whichever CPU: no IPI, no tracepoint), copies each found CPU's idle
 * time, as get_cpu_idle_time_us() reads it for /proc/stat but in ns, and its idle entries.
 * Userspace compares those entries with cpu_idle's for a few periods before it relies on
 * them (src/bpf/mod.rs, TICK_CHECK_READS).
 */
/* The tick timer's function (0: not found, and no record is ever found). */
u64 tick_timer_fn = 0;
/* Each CPU's struct tick_sched (0: not found yet); rows of 32 for the skeleton's Default. */
u64 tick_sched_at[MAX_SCAN_CPUS / 32][32];
/* Each CPU's idle plus iowait time since boot, in ns, and its idle entries (idle_calls: each
 * pass of the idle loop that could stop the tick, which precedes every halt where there is
 * no cpuidle driver, on kernels that count it there; others count only passes that went on
 * to try stopping it, and userspace then uses the time alone), as snapshot_tick_idle last
 * read them. */
u64 tick_idle_ns[MAX_SCAN_CPUS / 32][32];
u64 tick_idle_calls[MAX_SCAN_CPUS / 32][32];
/* Each CPU's cpu_idle counts at the snapshot (its idle_entries and idle_ns, copied there and
 * then), and the part so far of its halt under way (0: none) that on_cpu_idle will count
 * when it ends: so that what cpu_idle counted up to a moment is compared with the records up
 * to the same moment. Counted only at its end, one long halt (the tick stopped) would
 * otherwise land whole in the span where it ends, and a halt ending between a snapshot and a
 * later read of the counters would be counted in both. The part under way is meaningful
 * only while on_cpu_idle is attached (a detached program leaves its state stale); userspace
 * adds it only then. */
u64 halts_at_snapshot[MAX_SCAN_CPUS / 32][32];
u64 halted_ns_at_snapshot[MAX_SCAN_CPUS / 32][32];
u64 halt_under_way_ns[MAX_SCAN_CPUS / 32][32];

/* The tick hrtimer's function has had three names: tick_sched_timer, then
 * tick_nohz_highres_handler, now tick_nohz_handler (6.18 here). Kernels with either older
 * name also had a tick_nohz_handler, which handled the low-resolution tick and is no hrtimer
 * function: it is looked up last. A wrong match costs nothing but the search, which then
 * finds no CPU and gives up (src/bpf/mod.rs, TICK_SEARCH_READS). */
const char tick_fn_oldest[] = "tick_sched_timer";
const char tick_fn_older[] = "tick_nohz_highres_handler";
const char tick_fn_now[] = "tick_nohz_handler";

SEC("syscall")
int find_tick_function(void *ctx)
{
	u64 addr = 0;
	if (bpf_kallsyms_lookup_name(tick_fn_oldest, sizeof(tick_fn_oldest), 0, &addr) || !addr)
		if (bpf_kallsyms_lookup_name(tick_fn_older, sizeof(tick_fn_older), 0, &addr) || !addr)
			bpf_kallsyms_lookup_name(tick_fn_now, sizeof(tick_fn_now), 0, &addr);
	tick_timer_fn = addr;
	return 0;
}

SEC("tp_btf/hrtimer_start")
int BPF_PROG(on_hrtimer_start, struct hrtimer *timer)
{
	u64 fn = (u64)BPF_CORE_READ(timer, function);
	if (!fn || fn != tick_timer_fn)
		return 0;
	/* The tick is started and stopped on its own CPU; checked, not assumed. */
	u32 cpu = bpf_get_smp_processor_id();
	if (cpu >= MAX_SCAN_CPUS || BPF_CORE_READ(timer, base, cpu_base, cpu) != cpu)
		return 0;
	tick_sched_at[cpu / 32][cpu % 32] =
		(u64)timer - bpf_core_field_offset(struct tick_sched, sched_timer);
	return 0;
}

#define TS_FLAG_IDLE_ACTIVE (1UL << 2)

/*
 * `ts`'s idle plus iowait time up to `now` (the idle period under way included), read inside
 * its sequence count where the kernel has one, retried while an update is under way (x86
 * keeps loads in order; elsewhere a read racing an update could be off by that update, once).
 * False if no consistent read was had: the caller keeps the last one.
 */
static __always_inline bool read_tick_idle(const struct tick_sched *ts, u64 now, u64 *out)
{
	bool has_seq = bpf_core_field_exists(ts->idle_sleeptime_seq);
	for (int attempt = 0; attempt < 4; attempt++) {
		u32 seq = 0, seq_after = 0;
		if (has_seq) {
			bpf_core_read(&seq, sizeof(seq), &ts->idle_sleeptime_seq.sequence);
			if (seq & 1)
				continue;
		}
		bool active;
		if (bpf_core_field_exists(ts->flags)) {
			unsigned long flags = 0;
			bpf_core_read(&flags, sizeof(flags), &ts->flags);
			active = flags & TS_FLAG_IDLE_ACTIVE;
		} else {
			const struct tick_sched___bitfields *old = (const void *)ts;
			active = BPF_CORE_READ_BITFIELD_PROBED(old, idle_active);
		}
		s64 entry = 0, sleep = 0, iowait = 0;
		bpf_core_read(&entry, sizeof(entry), &ts->idle_entrytime);
		bpf_core_read(&sleep, sizeof(sleep), &ts->idle_sleeptime);
		bpf_core_read(&iowait, sizeof(iowait), &ts->iowait_sleeptime);
		if (has_seq) {
			bpf_core_read(&seq_after, sizeof(seq_after), &ts->idle_sleeptime_seq.sequence);
			if (seq_after != seq)
				continue;
		}
		u64 idle = (u64)sleep + (u64)iowait;
		if (active && entry > 0 && (u64)entry < now)
			idle += now - (u64)entry;
		*out = idle;
		return true;
	}
	return false;
}

SEC("raw_tp")
int snapshot_tick_idle(void *ctx)
{
	u64 now = bpf_ktime_get_ns();
	for (u32 cpu = 0; cpu < MAX_SCAN_CPUS; cpu++) {
		if (cpu >= scan_cpus)
			break;
		u64 at = tick_sched_at[cpu / 32][cpu % 32];
		if (!at)
			continue;
		u64 idle;
		if (read_tick_idle((const struct tick_sched *)at, now, &idle))
			tick_idle_ns[cpu / 32][cpu % 32] = idle;
		unsigned long calls = 0;
		if (!bpf_core_read(&calls, sizeof(calls), &((const struct tick_sched *)at)->idle_calls))
			tick_idle_calls[cpu / 32][cpu % 32] = calls;
		/* The counts before the state: a halt ending between the two loads is then left
		 * to the next snapshot, not counted in both. */
		u32 zero = 0;
		struct cpu_stats *cs = bpf_map_lookup_percpu_elem(&stats, &zero, cpu);
		if (cs) {
			halts_at_snapshot[cpu / 32][cpu % 32] = cs->idle_entries;
			halted_ns_at_snapshot[cpu / 32][cpu % 32] = cs->idle_ns;
		}
		/* As on_cpu_idle's exit will count it. */
		struct cpu_state *st = state_of(cpu);
		u64 under_way = 0;
		if (st) {
			u64 enter = st->idle_enter_ns;
			if (enter > st->idle_exit_ns && enter >= idle_attached_ns && enter < now)
				under_way = now - enter;
		}
		halt_under_way_ns[cpu / 32][cpu % 32] = under_way;
	}
	return 0;
}

/* A workload process's children belong to the workload from their first instruction. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child)
{
	if (!is_workload(parent))
		return 0;
	u32 tgid = child->tgid;
	u8 one = 1;
	bpf_map_update_elem(&workload_tgids, &tgid, &one, BPF_ANY);
	return 0;
}

/* Task storage goes with the task; only the workload's thread-group entry must go. */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *p)
{
	u32 pid = p->pid;
	if (pid == (u32)p->tgid)
		bpf_map_delete_elem(&workload_tgids, &pid);
	return 0;
}
