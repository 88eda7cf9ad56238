"""Facts and questions about them in other words: the recall cases lexical search cannot find.

Each question shares no word (nor a word's stem) with its fact's statement; ``marker`` is a
part of the statement that says the fact was recalled when it reaches the prompt. Written
for bench/recall_hybrid.py; no test or default was tuned on them.
"""

from __future__ import annotations

from dataclasses import dataclass

from memory.words import terms

__all__ = ["PARAPHRASES", "Paraphrase", "shared_words"]


@dataclass(frozen=True)
class Paraphrase:
    statement: str
    question: str
    marker: str


PARAPHRASES: tuple[Paraphrase, ...] = (
    Paraphrase("Let's ship every second Tuesday from now on.",
               "What did we decide about the release cadence?", "every second Tuesday"),
    Paraphrase("Invoices must round half-even to two decimals.",
               "What precision rule applies to monetary totals on bills?", "half-even"),
    Paraphrase("Never push directly to main; everything goes through a pull request.",
               "Am I allowed to commit straight onto the trunk branch?",
               "goes through a pull request"),
    Paraphrase("The staging database gets wiped every Sunday night.",
               "When is the pre-production DB reset?", "wiped every Sunday"),
    Paraphrase("Alice owns the payments service; ask her before changing it.",
               "Who is responsible for the billing microservice?", "Alice owns"),
    Paraphrase("We use pnpm, not npm or yarn, in the frontend repo.",
               "Which JavaScript package manager does the web client rely on?", "pnpm"),
    Paraphrase("Logs older than 30 days are deleted by the retention job.",
               "After how many weeks does old diagnostic output disappear?", "30 days"),
    Paraphrase("Feature flags live in LaunchDarkly under the project checkout-v2.",
               "Where are toggles for gradual rollouts configured?", "LaunchDarkly"),
    Paraphrase("The CI runners have 8 GB of RAM, so keep the suite under 6 GB.",
               "How large can the automated pipeline's memory footprint get?", "8 GB of RAM"),
    Paraphrase("Timestamps are stored in UTC and shown in the user's zone.",
               "Which timezone do we persist dates in?", "stored in UTC"),
    Paraphrase("The mobile app talks to the backend only through the GraphQL gateway.",
               "How do phone clients reach our servers?", "GraphQL gateway"),
    Paraphrase("Our error tracker is Sentry; the DSN is in the vault.",
               "Which tool collects crash reports?", "Sentry"),
    Paraphrase("Code freeze starts on December 15 for the holidays.",
               "When do we stop merging changes before the year-end break?", "December 15"),
    Paraphrase("Use tabs for indentation in the Go code, as gofmt does.",
               "What whitespace style do golang source files follow?", "tabs for indentation"),
    Paraphrase("The cache TTL for product pages is five minutes.",
               "How long do we keep catalogue listings memoised?", "five minutes"),
    Paraphrase("Emails go out through Postmark, never via our own SMTP server.",
               "Which provider delivers our transactional mail?", "Postmark"),
    Paraphrase("Passwords are hashed with argon2id.",
               "Which algorithm protects stored user credentials?", "argon2id"),
    Paraphrase("Bob is on vacation until the 20th; send reviews to Carol.",
               "Who should look at my pull requests this week?", "send reviews to Carol"),
    Paraphrase("Database migrations run automatically on deploy via Alembic.",
               "How are schema changes applied when we release?", "Alembic"),
    Paraphrase("The public API is versioned in the URL path, like /v2/orders.",
               "How do outside clients pick which revision of our endpoints they call?",
               "/v2/orders"),
    Paraphrase("Load tests use k6 and run nightly against staging.",
               "Which tool stresses the system to measure throughput?", "k6 and run nightly"),
    Paraphrase("Images are resized by a Lambda function on upload.",
               "Where does picture thumbnail generation happen?", "Lambda function"),
    Paraphrase("Keep PRs under 400 changed lines so they can be reviewed quickly.",
               "Is there a size limit for code contributions?", "400 changed lines"),
    Paraphrase("Our Kubernetes cluster autoscales between 3 and 12 nodes.",
               "What is the minimum and maximum machine count of the container platform?",
               "between 3 and 12 nodes"),
)


def _stems(text: str) -> set[str]:
    return {w[:5] for w in terms(text)}


def shared_words(case: Paraphrase) -> set[str]:
    """The words (by their first five letters) a question shares with its statement."""
    return _stems(case.statement) & _stems(case.question)
