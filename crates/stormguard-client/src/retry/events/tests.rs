use super::*;

#[test]
fn the_summary_counts_exactly_the_refusals_that_mean_a_failing_dependency() {
    let failing: Vec<_> = Refusal::ALL
        .into_iter()
        .filter(|r| r.is_retryable_but_refused())
        .collect();
    assert_eq!(failing, SUMMARISED);
}
