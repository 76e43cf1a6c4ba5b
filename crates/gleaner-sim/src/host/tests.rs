use super::*;
use crate::time::MS;

fn params(policy: HostPolicy) -> HostParams {
    HostParams {
        policy,
        latency: 24 * MS,
        min_gran: 3 * MS,
        wakeup_gran: 4 * MS,
        llc_size: 16,
        alpha: 2.0 / 3.0,
        gang_slice: 12 * MS,
        vcpu_switch: 8_000,
        cache_refill: 59_000,
    }
}

fn vm(vcpus: usize) -> VmSpec {
    VmSpec {
        vcpus,
        weight: 1024,
        allowed: None,
        pinned: false,
    }
}

/// Put halted vCPU `v` into `p`'s queue with the given vruntime, as if it had woken there.
fn queue(h: &mut Host, v: u32, p: usize, vruntime: u64) {
    h.vcpus[v as usize].vruntime = vruntime;
    h.vcpus[v as usize].state = VState::Queued(p as u32);
    h.attach(p, v);
    h.tree_insert(p, v);
}

fn running(h: &mut Host, v: u32, p: usize, vruntime: u64) {
    queue(h, v, p, vruntime);
    h.tree_remove(p, v);
    h.vcpus[v as usize].state = VState::Running(p as u32);
    h.pcpus[p].curr = Some(v);
    h.sync_rq_load(p);
    h.pcpus[p].last_ran = Some(v);
}

#[test]
fn cfs_runs_leftmost_and_charges_switch_costs() {
    let mut h = Host::new(params(HostPolicy::Cfs), 1, &[vm(1), vm(1)], 0);
    queue(&mut h, 0, 0, 500);
    queue(&mut h, 1, 0, 100);
    h.schedule(0, 0);
    assert_eq!(h.current(0), Some(1));
    assert_eq!(
        h.fx[0],
        Effect::Run {
            pcpu: 0,
            vcpu: 1,
            overhead: 8_000 + 59_000
        }
    );
    // Two equal tasks: each gets half of sched_latency.
    assert_eq!(
        h.fx[1],
        Effect::Tick {
            pcpu: 0,
            at: 12 * MS,
            gen: 1
        }
    );
}

#[test]
fn woken_vcpu_preempts_only_beyond_wakeup_granularity() {
    let mut h = Host::new(params(HostPolicy::Cfs), 1, &[vm(1), vm(1)], 0);
    running(&mut h, 0, 0, 0);
    h.vcpus[1].vruntime = 0;
    // After 20 ms of running, vruntime 20 ms; a sleeper is placed at min − 12 ms = 8 ms,
    // 12 ms behind: more than the 4 ms granularity, so it preempts.
    h.wake(1, 20 * MS);
    assert_eq!(h.current(0), Some(1));
    assert!(h.fx.contains(&Effect::Preempted { pcpu: 0, vcpu: 0 }));

    let mut h = Host::new(params(HostPolicy::Cfs), 1, &[vm(1), vm(1)], 0);
    running(&mut h, 0, 0, 0);
    h.vcpus[1].vruntime = 0;
    h.wake(1, 2 * MS);
    assert_eq!(
        h.current(0),
        Some(0),
        "2 ms ahead is within the granularity"
    );
}

#[test]
fn wake_prefers_idle_pcpu_and_bal_never_stacks_siblings() {
    let mut h = Host::new(params(HostPolicy::Cfs), 2, &[vm(2), vm(1)], 0);
    running(&mut h, 2, 0, 0);
    h.vcpus[0].last_pcpu = 0;
    h.wake(0, 0);
    assert_eq!(
        h.vcpus[0].state,
        VState::Running(1),
        "idle pCPU 1 is chosen over busy 0"
    );

    // BAL: vCPU 1's sibling runs on pCPU 1, pCPU 0 is busy with another VM: it queues on 0.
    let mut h = Host::new(params(HostPolicy::Bal), 2, &[vm(2), vm(1)], 0);
    running(&mut h, 0, 1, 0);
    running(&mut h, 2, 0, 0);
    h.vcpus[1].last_pcpu = 1;
    h.wake(1, MS);
    assert_eq!(h.vcpus[1].state, VState::Queued(0));
    // CFS would have stacked it on its previous pCPU with its sibling.
    let mut h = Host::new(params(HostPolicy::Cfs), 2, &[vm(2), vm(1)], 0);
    running(&mut h, 0, 1, 0);
    running(&mut h, 2, 0, 0);
    h.vcpus[1].last_pcpu = 1;
    h.wake(1, MS);
    assert_eq!(h.vcpus[1].state, VState::Queued(1));
}

/// pCPU 0: idle, queue [x0 (vr 100), o1 (vr 200)]. pCPU 1: runs o2; queue
/// [o3, o4, o5, o6, x1]: x1's ordinate is 4, its queue length 6, D_threshold = 2/3 × 6 = 4.
fn sbco_setup(policy: HostPolicy) -> Host {
    let mut h = Host::new(
        params(policy),
        2,
        &[vm(2), vm(1), vm(1), vm(1), vm(1), vm(1), vm(1)],
        0,
    );
    queue(&mut h, 0, 0, 100);
    queue(&mut h, 2, 0, 200);
    running(&mut h, 3, 1, 0);
    for (v, vr) in [(4, 10), (5, 20), (6, 30), (7, 35), (1, 40)] {
        queue(&mut h, v, 1, vr);
    }
    h
}

#[test]
fn sbco_picks_successor_when_distance_reaches_threshold() {
    let mut h = sbco_setup(HostPolicy::Sbco);
    assert_eq!(h.ordinate(1), Some(4));
    h.schedule(0, 0);
    assert_eq!(h.current(0), Some(2), "the successor o1 runs instead of x0");
    assert_eq!(h.stats.sbco_boosts, 1);
    assert!(h.vcpus[0].dirty && h.vcpus[1].dirty);
    // x0 lent ceil(4/2) slices of pCPU 1's queue (24 ms / 6 = 4 ms each).
    assert_eq!(h.vcpus[0].vruntime, 100 + 8 * MS);
    // The debt reaches x1 when pCPU 1 next picks; x1 jumps ahead and both are clean.
    h.schedule(1, 0);
    assert!(!h.vcpus[0].dirty && !h.vcpus[1].dirty);
    assert_eq!(h.current(1), Some(1));

    let mut h = sbco_setup(HostPolicy::Cfs);
    h.schedule(0, 0);
    assert_eq!(h.current(0), Some(0), "plain CFS runs the leftmost x0");
}

#[test]
fn sbco_leaves_close_siblings_alone() {
    let mut h = sbco_setup(HostPolicy::Sbco);
    // Move x1 to ordinate 3 < D_threshold 4.
    h.tree_remove(1, 1);
    h.vcpus[1].vruntime = 25;
    h.tree_insert(1, 1);
    assert_eq!(h.ordinate(1), Some(2));
    h.schedule(0, 0);
    assert_eq!(h.current(0), Some(0));
    assert_eq!(h.stats.sbco_boosts, 0);
}

#[test]
fn strict_gang_idles_where_relaxed_backfills() {
    for (policy, expect) in [
        (HostPolicy::CoschedStrict, None),
        (HostPolicy::CoschedRelaxed, Some(2)),
    ] {
        // VM 0 (2 vCPUs) bound to pCPUs 0 and 1; VM 1 (1 vCPU) bound to pCPU 0.
        let mut h = Host::new(params(policy), 2, &[vm(2), vm(1)], 0);
        assert_eq!(h.vcpus[2].gang_pcpu, 0);
        h.wake(0, 0);
        assert_eq!(h.current(0), Some(0), "the slot VM's vCPU runs at once");
        h.block(0, MS);
        h.wake(2, MS);
        // Slot still belongs to VM 0 whose vCPU 0 halted: strict idles, relaxed backfills.
        assert_eq!(h.current(0), expect, "{policy:?}");
        // The owner wakes and takes its pCPU back at once.
        h.wake(0, 2 * MS);
        assert_eq!(h.current(0), Some(0));
    }
}

#[test]
fn directed_yield_runs_the_preempted_holder_next() {
    let mut h = Host::new(params(HostPolicy::Cfs), 1, &[vm(2), vm(1)], 0);
    running(&mut h, 2, 0, 0);
    queue(&mut h, 0, 0, 3 * MS);
    h.yield_to(0, MS);
    assert_eq!(
        h.current(0),
        Some(0),
        "next buddy within wakeup_granularity runs"
    );
    assert_eq!(h.vcpus[0].vruntime, 3 * MS, "and keeps its vruntime");
    assert_eq!(h.stats.directed_yields, 1);

    // A buddy more than wakeup_granularity behind in fairness does not jump the queue.
    let mut h = Host::new(params(HostPolicy::Cfs), 1, &[vm(2), vm(1)], 0);
    running(&mut h, 2, 0, 0);
    queue(&mut h, 0, 0, 50 * MS);
    h.yield_to(0, MS);
    assert_eq!(h.current(0), Some(2));
}

#[test]
fn periodic_balance_pulls_from_a_busier_queue() {
    let mut h = Host::new(params(HostPolicy::Cfs), 2, &[vm(1), vm(1), vm(1)], 0);
    running(&mut h, 0, 0, 0);
    queue(&mut h, 1, 0, 10);
    queue(&mut h, 2, 0, 20);
    h.balance(1, 0);
    assert_eq!(
        h.current(1),
        Some(2),
        "the queued task with most vruntime moves"
    );
    assert_eq!(h.nr_running(0), 2);
}

#[test]
fn a_busy_pcpu_one_vcpu_short_pulls_only_after_its_failed_tries() {
    // pCPU 0 runs vCPU 0 with vCPU 1 queued; pCPU 1 runs vCPU 2 alone. Moving one only swaps
    // the imbalance, so the kernel's first busy balances move nothing; once their failures
    // have halved the load it compares, one does (and the queues take turns): after one to
    // three busy intervals, the instant drawn.
    for seed in 0..8 {
        let mut h = Host::new(params(HostPolicy::Cfs), 2, &[vm(2), vm(1)], seed);
        running(&mut h, 0, 0, 0);
        queue(&mut h, 1, 0, 10);
        running(&mut h, 2, 1, 0);
        let mut moved_at = None;
        for i in 1..=3 * BUSY_FACTOR {
            h.balance(1, u64::from(i) * 4 * MS);
            if h.nr_running(1) == 2 {
                moved_at = Some(i);
                break;
            }
        }
        let i = moved_at.expect("the queued vCPU moves within three busy intervals");
        assert!(i >= BUSY_FACTOR, "seed {seed}: moved at balance {i}");
        assert_eq!(h.nr_running(0), 1);
        assert_eq!(h.vcpus[1].state, VState::Queued(1));
    }
}

#[test]
fn busiest_ties_go_to_the_first_queue_after_the_balancing_pcpu() {
    // pCPUs 0 and 2 both hold two vCPUs; pCPU 1 pulls from 2 (next after it), pCPU 3 from 0.
    let mut h = Host::new(params(HostPolicy::Cfs), 4, &[vm(4)], 0);
    running(&mut h, 0, 0, 0);
    queue(&mut h, 1, 0, 10);
    running(&mut h, 2, 2, 0);
    queue(&mut h, 3, 2, 10);
    assert_eq!(h.busiest(0..4, 1), Some(2));
    assert_eq!(h.busiest(0..4, 3), Some(0));
}
