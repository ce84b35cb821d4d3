//! One request through a real `tower::retry::Retry`, for the tests of both budgets' tower
//! implementations.

use std::future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tower::retry::budget::Budget;
use tower::retry::{Policy, Retry};
use tower::{ServiceExt, service_fn};

/// A stop for a budget that grants every retry: the test then fails, not hangs.
const SAFETY_STOP: usize = 100;

/// Retries every failure while the budget allows (the budget is its only limit, short
/// of [`SAFETY_STOP`] retries) and deposits every success.
#[derive(Debug)]
struct BudgetOnly<B> {
    budget: Arc<B>,
    retries: usize,
}

impl<B> Clone for BudgetOnly<B> {
    fn clone(&self) -> Self {
        BudgetOnly {
            budget: Arc::clone(&self.budget),
            retries: self.retries,
        }
    }
}

impl<B: Budget, Req: Clone, Res, E> Policy<Req, Res, E> for BudgetOnly<B> {
    type Future = future::Ready<()>;

    fn retry(&mut self, _req: &mut Req, result: &mut Result<Res, E>) -> Option<Self::Future> {
        match result {
            Ok(_) => {
                self.budget.deposit();
                None
            }
            Err(_) if self.retries < SAFETY_STOP && self.budget.withdraw() => {
                self.retries += 1;
                Some(future::ready(()))
            }
            Err(_) => None,
        }
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        Some(req.clone())
    }
}

/// Sends one request through `Retry` with [`BudgetOnly`] over `budget` to a service
/// whose every attempt succeeds if `succeeds` and fails otherwise. Returns how many
/// attempts reached the service and whether the call succeeded.
pub(crate) async fn call<B: Budget>(budget: &Arc<B>, succeeds: bool) -> (usize, bool) {
    let attempts = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&attempts);
    let service = service_fn(move |request: u32| {
        counted.fetch_add(1, Ordering::SeqCst);
        future::ready(if succeeds {
            Ok(request)
        } else {
            Err("unavailable")
        })
    });
    let policy = BudgetOnly {
        budget: Arc::clone(budget),
        retries: 0,
    };
    let result = Retry::new(policy, service).oneshot(7).await;
    (attempts.load(Ordering::SeqCst), result.is_ok())
}
