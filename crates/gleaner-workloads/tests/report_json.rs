//! The JSON report is consumed by the bench harness and other tools, so its
//! shape is part of the public contract; these tests pin it down.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed assumption is a failed test

use gleaner_workloads::{pingpong, pipeline, Length, PingpongConfig, PipelineConfig, Report};
use serde_json::Value;

fn json(report: &Report) -> Value {
    let text = report.to_json().unwrap();
    assert!(!text.contains('\n'), "JSON report must be one line");
    serde_json::from_str(&text).unwrap()
}

#[test]
fn pipeline_report_has_the_documented_fields() {
    let cfg = PipelineConfig {
        stages: 2,
        threads_per_stage: 2,
        queue_capacity: 4,
        phases: "fine:40,coarse:10".parse().unwrap(),
    };
    let value = json(&pipeline(&cfg).unwrap());
    assert_eq!(value["workload"], "pipeline");
    assert_eq!(value["threads"], 6);
    assert_eq!(value["unit"], "items");
    assert_eq!(value["ops"], 50);
    assert!(value["elapsed_s"].as_f64().unwrap() > 0.0);
    assert!(value["throughput_per_s"].as_f64().unwrap() > 0.0);
    assert!(value["checksum"].is_u64());
    assert_eq!(value["stage_items"], serde_json::json!([50, 50]));
    assert!(value.get("latency_ns").is_none());

    let phases = value["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 2);
    assert_eq!(phases[0]["label"], "fine");
    assert_eq!(phases[0]["work"], 500);
    assert_eq!(phases[0]["ops"], 40);
    assert_eq!(phases[1]["label"], "coarse");
    assert_eq!(phases[1]["ops"], 10);
    for phase in phases {
        assert!(phase["elapsed_s"].is_f64());
        assert!(phase["throughput_per_s"].is_f64());
    }
}

#[test]
fn pingpong_report_carries_latency_percentiles() {
    let value = json(
        &pingpong(&PingpongConfig {
            length: Length::Count(50),
            count_file: None,
        })
        .unwrap(),
    );
    assert_eq!(value["workload"], "pingpong");
    assert_eq!(value["ops"], 50);
    assert!(value.get("checksum").is_none());
    let latency = &value["latency_ns"];
    for key in ["samples", "p50", "p90", "p99", "max"] {
        assert!(latency[key].is_u64(), "latency_ns.{key} missing");
    }
}

#[test]
fn human_line_is_one_line_with_checksum() {
    let cfg = PipelineConfig {
        stages: 1,
        threads_per_stage: 1,
        queue_capacity: 2,
        phases: "work=5:10".parse().unwrap(),
    };
    let report = pipeline(&cfg).unwrap();
    let line = report.to_string();
    assert!(!line.contains('\n'));
    assert!(line.starts_with("pipeline: threads=3 items=10 "));
    assert!(line.contains(&format!("checksum={:016x}", report.checksum.unwrap())));
}
