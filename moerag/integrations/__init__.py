"""moerag inside agent frameworks: a retriever for LangChain (`moerag.integrations.langchain`) and
one for LlamaIndex (`moerag.integrations.llamaindex`), each over `moerag.client`; each imports
its framework when used, so neither is a dependency of moerag."""
