use super::*;

#[test]
fn codes_sort_into_broken_busy_and_working() {
    use ReplicaOutcome::*;
    assert_eq!(outcome_of_code(Code::Unavailable, None), Failure);
    assert_eq!(outcome_of_code(Code::Internal, None), Failure);
    let retry_later = Some(Pushback::RetryAfter(std::time::Duration::from_millis(5)));
    assert_eq!(outcome_of_code(Code::Unavailable, retry_later), Overload);
    assert_eq!(outcome_of_code(Code::ResourceExhausted, None), Overload);
    assert_eq!(outcome_of_code(Code::DeadlineExceeded, None), Overload);
    assert_eq!(outcome_of_code(Code::NotFound, None), Success);
    assert_eq!(outcome_of_code(Code::Ok, None), Success);
}
