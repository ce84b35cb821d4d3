use super::*;

#[test]
fn only_serving_serves() {
    assert_eq!(serving(Answer::Serving), ServingStatus::Serving);
    assert_eq!(serving(Answer::NotServing), ServingStatus::NotServing);
    assert_eq!(serving(Answer::Unknown), ServingStatus::NotServing);
    assert_eq!(
        serving(Answer::ServiceUnknown),
        ServingStatus::ServiceUnknown
    );
    assert!(!connection_failed(&tonic::Status::unavailable(
        "from the server"
    )));
}
