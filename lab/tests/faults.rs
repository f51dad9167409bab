//! A Cluster under the network's and the clock's faults: a partition with writes on both sides,
//! loss and delay on every link, a Machine whose clock runs an hour ahead, and concurrent joins
//! through two entry Machines that cannot see each other.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use ployz_lab::{Lab, LabOptions, MachineOptions};

#[test]
#[ignore = "needs root, dockerd and the lab (scripts/test.sh runs it)"]
fn a_partition_heals_to_one_winner_without_resurrections() {
    let mut lab = cluster(3);
    ok(&lab, 0, &["store", "put", "shared=before", "doomed=1"]);
    wait_for(
        &lab,
        "equal digests before the partition",
        Duration::from_secs(20),
        || digests_equal(&lab, &[0, 1, 2]).then_some(()),
    );

    lab.partition(&[&[0, 1], &[2]]);
    // Writes on both sides for 30 s, one cluster-scoped key written on both sides, a delete
    // on one side.
    let until = Instant::now() + Duration::from_secs(30);
    let mut n = 0;
    ok(&lab, 0, &["store", "rm", "doomed"]);
    while Instant::now() < until {
        ok(
            &lab,
            0,
            &["store", "put", &format!("a{n}=x"), &format!("shared=a{n}")],
        );
        ok(
            &lab,
            2,
            &["store", "put", &format!("b{n}=x"), &format!("shared=b{n}")],
        );
        n += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    // Each side observed the other down.
    let ids: Vec<String> = (0..3).map(|i| own_id(&lab, i)).collect();
    let o0 = observed(&lab, 0).unwrap();
    let o2 = observed(&lab, 2).unwrap();
    assert_eq!(o0[&ids[2]].1, "down", "{o0:?}");
    assert_eq!(o2[&ids[0]].1, "down", "{o2:?}");

    lab.heal();
    let healed = Instant::now();
    wait_for(
        &lab,
        "equal digests after healing",
        Duration::from_secs(30),
        || digests_equal(&lab, &[0, 1, 2]).then_some(()),
    );
    eprintln!(
        "digests equal {:.2} s after healing",
        healed.elapsed().as_secs_f64()
    );
    let views: Vec<BTreeMap<String, (String, String)>> =
        (0..3).map(|i| scratch(&lab, i).unwrap()).collect();
    assert_eq!(views[0], views[1]);
    assert_eq!(views[0], views[2]);
    // The same winner everywhere, one of the last writes; the delete stayed a delete.
    let (winner, _) = &views[0]["shared"];
    assert!(
        winner == &format!("a{}", n - 1) || winner == &format!("b{}", n - 1),
        "shared = {winner}"
    );
    assert!(!views[0].contains_key("doomed"), "a deleted key came back");
    assert!(
        views[0].contains_key(&format!("a{}", n - 1))
            && views[0].contains_key(&format!("b{}", n - 1))
    );
}

#[test]
#[ignore = "needs root, dockerd and the lab (scripts/test.sh runs it)"]
fn loss_and_delay_on_every_link_cause_no_false_down() {
    let mut lab = cluster(3);
    lab.netem(20.0, 50);
    let until = Instant::now() + Duration::from_secs(60);
    let mut downs = Vec::new();
    let mut rounds = 0;
    let mut n = 0;
    while Instant::now() < until {
        for i in 0..3 {
            if let Some(o) = observed(&lab, i) {
                for (id, (_, m)) in o {
                    if m == "down" {
                        downs.push(format!("Machine {i} observed {id} down"));
                    }
                }
            }
        }
        if rounds % 5 == 0 {
            ok(&lab, rounds % 3, &["store", "put", &format!("lossy{n}=x")]);
            n += 1;
        }
        rounds += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        downs.is_empty(),
        "false downs under 20% loss and 50 ms delay: {downs:?}"
    );
    // Replication converged, still under loss.
    wait_for(
        &lab,
        "equal digests under loss",
        Duration::from_secs(30),
        || digests_equal(&lab, &[0, 1, 2]).then_some(()),
    );
    lab.clear_netem();
    eprintln!("{rounds} observation rounds, {n} writes, no false down");
}

#[test]
#[ignore = "needs root, dockerd and the lab (scripts/test.sh runs it)"]
fn a_clock_an_hour_ahead_does_not_win() {
    let hour = 3_600_000;
    let mut options = options(3);
    options.per_machine = vec![
        MachineOptions::default(),
        MachineOptions::default(),
        MachineOptions {
            clock_offset_ms: hour,
            ..MachineOptions::default()
        },
    ];
    let mut lab = Lab::start(options);
    ok(&lab, 0, &["machine", "init", "--name", "m0"]);
    ok(
        &lab,
        0,
        &["machine", "add", "--name", "m1", &lab.ssh_url(1)],
    );
    ok(
        &lab,
        0,
        &["machine", "add", "--name", "m2", &lab.ssh_url(2)],
    );
    let skewed = own_id(&lab, 2);
    wait_for(
        &lab,
        "the others observe the skewed Machine up",
        Duration::from_secs(30),
        || {
            [0, 1]
                .iter()
                .all(|&i| {
                    observed(&lab, i)
                        .is_some_and(|o| o.get(&skewed).is_some_and(|(_, m)| m == "up"))
                })
                .then_some(())
        },
    );

    ok(&lab, 2, &["store", "put", "key=from-the-future"]);
    ok(&lab, 0, &["store", "put", "key=from-m0"]);
    wait_for(
        &lab,
        "the others count the refusal",
        Duration::from_secs(20),
        || {
            [0, 1]
                .iter()
                .all(|&i| {
                    let d = lab.json(i, &["store", "digest", "--json"]);
                    d["clock_refusals"][&skewed].as_u64().is_some_and(|n| n > 0)
                })
                .then_some(())
        },
    );
    ok(&lab, 1, &["store", "put", "key=from-m1"]);
    wait_for(
        &lab,
        "m1's later write wins on m0 and m1",
        Duration::from_secs(20),
        || {
            [0, 1]
                .iter()
                .all(|&i| {
                    scratch(&lab, i)
                        .is_some_and(|s| s.get("key").is_some_and(|(v, _)| v == "from-m1"))
                })
                .then_some(())
        },
    );
    // The refusal is logged, naming the setting.
    assert!(
        (0..2).any(|i| lab.log(i).contains("max_clock_drift_ms")),
        "no log line names the setting\n{}",
        logs(&lab)
    );

    // Machine 2's clock is set right: its timestamps stay an hour ahead, so the others go on
    // refusing its writes, and it says so itself (digest, log, metric).
    lab.set_machine_options(2, MachineOptions::default());
    lab.term_daemon(2);
    lab.start_daemon(2);
    let digest = lab.json(2, &["store", "digest", "--json"]);
    let behind = digest["clock_went_back_ms"].as_u64().unwrap_or(0);
    assert!(
        (3_500_000..=3_600_000).contains(&behind),
        "Machine 2 does not say its clock went back an hour: {digest}"
    );
    wait_for(
        &lab,
        "Machine 2 logs that its clock went back",
        Duration::from_secs(30),
        || {
            lab.log(2)
                .contains("this Machine's clock went back")
                .then_some(())
        },
    );
    let metrics = text(&lab.exec_in(2, &["curl", "-s", "http://127.0.0.1:51090/metrics"]));
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("ployz_store_clock_ahead_seconds 35")),
        "{metrics}"
    );
}

#[test]
#[ignore = "needs root, dockerd and the lab (scripts/test.sh runs it)"]
fn concurrent_joins_through_two_entries_that_cannot_see_each_other_are_reported() {
    let mut lab = Lab::start(LabOptions {
        sshd: true,
        ..LabOptions::machines(4)
    });
    ok(&lab, 0, &["machine", "init", "--name", "m0"]);
    ok(
        &lab,
        0,
        &["machine", "add", "--name", "m1", &lab.ssh_url(1)],
    );
    wait_for(
        &lab,
        "m0 and m1 participate",
        Duration::from_secs(30),
        || {
            [0, 1]
                .iter()
                .all(|&i| {
                    observed(&lab, i).is_some_and(|o| {
                        o.len() == 2 && o.values().all(|(p, m)| p == "participating" && m == "up")
                    })
                })
                .then_some(())
        },
    );
    // m0 and m1 cannot see each other; the CLI still reaches m2 and m3 (in no group).
    lab.partition(&[&[0], &[1]]);
    let a = lab.ployz(
        0,
        &[
            "machine",
            "add",
            "--wait",
            "0",
            "--name",
            "m2",
            &lab.ssh_url(2),
        ],
    );
    let b = lab.ployz(
        1,
        &[
            "machine",
            "add",
            "--wait",
            "0",
            "--name",
            "m3",
            &lab.ssh_url(3),
        ],
    );
    assert!(a.status.success(), "{}", text(&a));
    assert!(b.status.success(), "{}", text(&b));
    lab.heal();
    let ids = [own_id(&lab, 2), own_id(&lab, 3)];
    let flagged = wait_for(
        &lab,
        "the collision is shown",
        Duration::from_secs(30),
        || {
            let list = machines(&lab, 0)?;
            let flagged: Vec<String> = list
                .iter()
                .filter(|m| m.get("subnet_collisions").is_some())
                .filter_map(|m| m["id"].as_str().map(str::to_owned))
                .collect();
            (flagged.len() == 2).then_some(flagged)
        },
    );
    assert!(
        flagged.contains(&ids[0]) && flagged.contains(&ids[1]),
        "{flagged:?}"
    );
    let ls = lab.ployz(0, &["machine", "ls"]);
    assert!(
        String::from_utf8_lossy(&ls.stdout).contains("(COLLISION)"),
        "{}",
        text(&ls)
    );
    assert!(
        String::from_utf8_lossy(&ls.stderr).contains("shares subnet"),
        "{}",
        text(&ls)
    );
    let metrics = lab.exec_in(0, &["curl", "-s", "http://127.0.0.1:51090/metrics"]);
    assert!(
        String::from_utf8_lossy(&metrics.stdout).contains("ployz_mesh_subnet_collisions 2"),
        "{}",
        text(&metrics)
    );
    wait_for(
        &lab,
        "the collision is logged",
        Duration::from_secs(15),
        || {
            lab.log(0)
                .contains("machine subnet collision")
                .then_some(())
        },
    );
}
